"""The data catalog (``ABLATE_DATA_CATALOG``): hub names read from local copies, as a corpus and as a
task's splits, with the same cache keys as the files named directly; a broken catalog is one line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.datamodules.catalog import ENV
from ablate.datamodules.classification import ClassificationDataModule
from ablate.datamodules.corpus import iter_documents
from ablate.datamodules.provenance import CATALOG_TAG, CORPUS_TAG, data_tags
from ablate.datamodules.sources import resolve_corpus, resolve_task
from ablate.datamodules.tokenizer import fingerprint, train_tokenizer
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import DataConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.load import build_config

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [f"Article {i} is about topic {i}.\nIt has a second paragraph, number {i}." for i in range(40)]
SST2 = {
    "train": [("a gripping , funny film", 1), ("dull and long", 0), ("the best of the year", 1), ("a mess", 0)],
    "validation": [("warm and wise", 1), ("tedious", 0)],
    "test": [("lovely", 1), ("flat", 0), ("a joy", 1)],
}
CATALOG = """\
datasets:
  wikimedia/wikipedia:20231101.en:
    train: wiki-en/train-*.jsonl.gz
  nyu-mll/glue:sst2:
    train: sst2/train.tsv
    validation: [sst2/validation.tsv]
    test: sst2/test.tsv
"""


def _copies(root: Path) -> Path:
    """Local copies in the layout of docs/data.md, with a catalog beside them (relative paths)."""
    (root / "wiki-en").mkdir(parents=True)
    for shard in range(2):
        with gzip.open(root / "wiki-en" / f"train-0{shard}-of-02.jsonl.gz", "wt", encoding="utf-8") as fh:
            for i in range(shard, len(TEXTS), 2):
                fh.write(json.dumps({"id": str(i), "title": f"T{i}", "text": TEXTS[i]}) + "\n")
    (root / "sst2").mkdir()
    for split, rows in SST2.items():
        lines = ["sentence\tlabel", *(f"{s}\t{y}" for s, y in rows)]
        (root / "sst2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    catalog = root / "catalog.yaml"
    catalog.write_text(CATALOG, encoding="utf-8")
    return catalog


@pytest.fixture()
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Copies and their catalog under ``tmp/data``, set as ABLATE_DATA_CATALOG; the working folder elsewhere."""
    path = _copies(tmp_path / "data")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # relative paths are the catalog's folder's, not the working folder's
    monkeypatch.setenv(ENV, str(path))
    return path


def test_a_catalogued_corpus_is_its_local_files_and_shares_their_cache_key(
    catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = sorted(str(p) for p in (catalog.parent / "wiki-en").glob("*.jsonl.gz"))
    for spelling in ("wikimedia/wikipedia:20231101.en", "wikimedia/wikipedia/20231101.en"):
        spec = resolve_corpus(spelling)
        assert (spec.files, spec.builder, spec.catalog) == (tuple(shards), "json", str(catalog))
    data = DataConfig(corpus="wikimedia/wikipedia:20231101.en", text_doc_chars=0)
    assert sorted(iter_documents(data, None)) == sorted(TEXTS)
    direct = DataConfig(corpus=str(catalog.parent / "wiki-en" / "train-*.jsonl.gz"), text_doc_chars=0)
    assert fingerprint(data, 1000) == fingerprint(direct, 1000)  # the same files: the same cached tokenizer
    assert resolve_corpus("glue:sst2").files == ()  # not in the catalog: a hub name
    monkeypatch.delenv(ENV)
    hub = resolve_corpus(data.corpus)
    assert (hub.builder, hub.config_name, hub.files) == ("wikimedia/wikipedia", "20231101.en", ())
    assert fingerprint(data, 1000) != fingerprint(direct, 1000)  # the hub's Wikipedia is another corpus


def test_a_task_reads_the_catalogs_splits(catalog: Path, tmp_path: Path) -> None:
    tok = tmp_path / "tokenizer.json"
    sentences = [s for rows in SST2.values() for s, _ in rows]
    train_tokenizer(sentences * 5, 200, lowercase=True).save(str(tok))
    dm = ClassificationDataModule(FinetuneConfig(train="nyu-mll/glue:sst2"), tok)  # dev: the validation split
    dm.setup()
    assert (dm.num_train, dm.num_validation) == (4, 2)
    assert dm.val_set is not None and dm.val_set.labels.tolist() == [1, 0]
    dm = ClassificationDataModule(FinetuneConfig(train="nyu-mll/glue/sst2", validation_split="test"), tok)
    dm.setup()
    assert dm.num_validation == 3 and dm.val_set is not None and dm.val_set.labels.tolist() == [1, 0, 1]
    src = resolve_task("tasks[0].train", "nyu-mll/glue:sst2")
    assert src.files == (str(catalog.parent / "sst2" / "train.tsv"),) and src.catalog == str(catalog)
    with pytest.raises(DataError) as info:
        ClassificationDataModule(FinetuneConfig(train="nyu-mll/glue:sst2", train_split="dev"), tok)
    assert str(info.value) == (
        f"finetune.train: nyu-mll/glue:sst2: {ENV}: {catalog}: nyu-mll/glue:sst2 has no 'dev' split "
        "(it has train, validation, test)"
    )
    local = str(catalog.parent / "sst2" / "train.tsv")
    with pytest.raises(ConfigError, match=r"^finetune\.train_split: 'test': .*train\.tsv is a local file, which has"):
        ClassificationDataModule(FinetuneConfig(train=local, validation=local, train_split="test"), tok)


def test_a_missing_copy_and_a_malformed_hub_name_are_named(catalog: Path) -> None:
    catalog.write_text(CATALOG.replace("wiki-en/train-*", "wiki-en/nope-*"), encoding="utf-8")
    with pytest.raises(DataError) as info:
        resolve_corpus("wikimedia/wikipedia:20231101.en")
    assert str(info.value) == (
        f"data.corpus: wikimedia/wikipedia:20231101.en: {ENV}: {catalog}: train: "
        f"{catalog.parent}/wiki-en/nope-*.jsonl.gz: no file matches this pattern"
    )
    with pytest.raises(DataError, match=r"^data\.corpus: wiki en: neither an existing file nor a hub dataset"):
        resolve_corpus("wiki en")
    with pytest.raises(DataError, match=r"^finetune\.train: a:b:c: neither .*not a hub config name: 'b:c'$"):
        resolve_task("finetune.train", "a:b:c")


def test_each_run_is_tagged_with_what_its_data_names_resolved_to(
    catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretrain = build_config({"data": {"corpus": "wikimedia/wikipedia:20231101.en"}})
    tags = data_tags(pretrain)
    assert tags[CATALOG_TAG] == str(catalog)
    assert tags[CORPUS_TAG].startswith(f"train split via {ENV} ({catalog}): 2 files: {catalog.parent}/wiki-en/")
    finetune = build_config({"regime": "finetune", "finetune": {"source": "runs:/x", "train": "nyu-mll/glue:sst2"}})
    tags = data_tags(finetune)
    assert tags["ablate.data.finetune.validation"].endswith(f"1 file: {catalog.parent}/sst2/validation.tsv")
    assert CORPUS_TAG not in tags  # a fine-tuning run reads no corpus
    monkeypatch.delenv(ENV)
    assert data_tags(pretrain) == {CORPUS_TAG: "hub wikimedia/wikipedia:20231101.en, split train (datasets)"}


BAD = {
    "missing": (None, "no such file"),
    "a folder": ("DIR", "is a folder, not a catalog file"),
    "not YAML": ("datasets: [\n", "invalid YAML at line 2"),
    "empty": ("", "empty file"),
    "a list": ("- a\n", "expected a catalog"),
    "unknown key": ("dataset: {}\n", "dataset: unknown key"),
    "a path for a name": ("datasets:\n  ./wiki: {train: a.jsonl}\n", "datasets../wiki: a local path, not a hub name"),
    "no hub name": ("datasets:\n  wiki en: {train: a.jsonl}\n", "datasets.wiki en: not a hub dataset name"),
    "twice": ("datasets:\n  a/b:c: {train: x}\n  a/b/c: {train: y}\n", "datasets.a/b/c: the same dataset as a/b:c"),
    "no split": ("datasets:\n  a/b:c: {}\n", "datasets.a/b:c: no split"),
    "no file": ("datasets:\n  a/b:c: {train: ''}\n", "datasets.a/b:c.train: empty; give a file"),
    "not a path": ("datasets:\n  a/b:c: {train: 3}\n", "datasets.a/b:c.train: 3: give a file, glob or folder"),
    "bad split": ("datasets:\n  a/b:c: {'dev set': x}\n", "datasets.a/b:c.dev set: not a split name"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_broken_catalog_is_one_line_and_writes_nothing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    content, message = BAD[case]
    path = tmp_path / "catalog.yaml"
    if content == "DIR":
        path.mkdir()
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv(ENV, str(path))
    with pytest.raises(ConfigError) as info:
        resolve_corpus("norvig-big")  # a broken catalog fails every resolution, a builtin corpus's too
    assert str(info.value).startswith(f"{ENV}: {path}: ") and message in str(info.value), str(info.value)
    assert main(["sweep", "--check", str(ROOT / "sweeps" / "studies" / "quickstart.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {ENV}: {path}: ") and err.count("\n") == 1 and message in err, err
    assert list(work.iterdir()) == []
