"""Corpus resolution, reading, errors, train/validation split and sharding."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from ablate.datamodules.corpus import DOC_SHUFFLE_BUFFER, check_corpus, is_validation, iter_documents, num_shards
from ablate.datamodules.sources import resolve_corpus
from ablate.datamodules.stream import DocumentStream
from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import DataConfig


def _cfg(corpus: str | Path, **kw) -> DataConfig:  # type: ignore[no-untyped-def]
    return DataConfig(corpus=str(corpus), **{"text_doc_chars": 0, **kw})


def _all(corpus: str | Path, **kw) -> list[str]:  # type: ignore[no-untyped-def]
    return list(iter_documents(_cfg(corpus, **kw), None))


def test_text_paragraphs_are_documents(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("First para, line one\nline two.\n\nSecond para.\n\n\n  \nThird.\n", encoding="utf-8")
    assert _all(f) == ["First para, line one line two.", "Second para.", "Third."]


def test_jsonl_gz_json_and_parquet(tmp_path: Path) -> None:
    records = [{"body": "One.\nTwo.", "id": 1}, {"body": "Three.", "id": 2}, {"body": None, "id": 3}]
    with gzip.open(tmp_path / "x.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("\n".join(json.dumps(r) for r in records))
    assert _all(tmp_path / "x.jsonl.gz", text_field="body") == ["One.\nTwo.", "Three."]
    (tmp_path / "y.json").write_text(json.dumps(records[0]), encoding="utf-8")
    assert _all(tmp_path / "y.json", text_field="body") == ["One.\nTwo."]
    pq.write_table(pa.table({"text": ["P1.", "P2."]}), tmp_path / "z.parquet")
    assert _all(tmp_path / "z.parquet") == ["P1.", "P2."]


def test_directory_and_glob(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("A.\n\nB.", encoding="utf-8")
    (tmp_path / "d" / "sub" / "b.txt").write_text("C.", encoding="utf-8")
    assert _all(tmp_path / "d") == ["A.", "B.", "C."]
    assert _all(f"{tmp_path}/d/*.txt") == ["A.", "B."]
    assert num_shards(_cfg(tmp_path / "d")) == 2


def test_builtin_norvig_big() -> None:
    spec = resolve_corpus("norvig-big")
    assert spec.files[0].endswith("big.txt") and spec.builder == "text"
    first = next(iter_documents(_cfg("norvig-big"), None))
    assert first.startswith("The Project Gutenberg EBook of The Adventures of Sherlock Holmes")


def test_hub_names(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolve_corpus("Salesforce/wikitext/wikitext-103-raw-v1")
    assert (spec.builder, spec.config_name, spec.files) == ("Salesforce/wikitext", "wikitext-103-raw-v1", ())
    assert resolve_corpus("wikitext:wikitext-2-raw-v1").config_name == "wikitext-2-raw-v1"
    assert (resolve_corpus("owner/name").builder, resolve_corpus("owner/name").config_name) == ("owner/name", None)
    assert resolve_corpus("Salesforce/wikitext:wikitext-2-raw-v1").builder == "Salesforce/wikitext"
    assert resolve_corpus("owner/name:").config_name is None
    assert resolve_corpus("bookcorpus").config_name is None

    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DataError, match=r"^data.corpus: wikitext/wikitext-103-raw-v1: cannot load"):
        next(iter_documents(_cfg("wikitext/wikitext-103-raw-v1")))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.txt", None, "no such file"),
        ("empty.txt", b"", "corpus is empty"),
        ("blank.txt", b"  \n\n \n", "corpus is empty"),
        ("latin1.txt", "caf\xe9 au lait.\n".encode("latin-1"), "latin1.txt: not UTF-8 text"),
        ("latin1.jsonl", b'{"text": "caf\xe9"}\n', "latin1.jsonl: not UTF-8 text"),
        ("broken.jsonl", b"not json\n", "cannot read"),
        ("notes.csv", b"a,b\n", "unknown extension"),
    ],
)
def test_corpus_errors_name_the_file(tmp_path: Path, name: str, content: bytes | None, message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError) as info:
        check_corpus(_cfg(path))
    text = str(info.value)
    assert text.startswith(f"data.corpus: {path}") and message in text, text


def test_other_corpus_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no file matches"):
        resolve_corpus(f"{tmp_path}/*.jsonl")
    with pytest.raises(DataError, match="directory has no"):
        resolve_corpus(str(tmp_path))
    (tmp_path / "r.jsonl").write_text('{"body": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"^data.text_field: 'text' is not a column"):
        check_corpus(_cfg(tmp_path / "r.jsonl"))
    (tmp_path / "one.txt").write_text("Just one paragraph.", encoding="utf-8")
    with pytest.raises(DataError, match="corpus is too small"):
        check_corpus(_cfg(tmp_path / "one.txt"))


def test_split_by_document_hash(wiki_data: Callable[..., DataConfig]) -> None:
    data = wiki_data(val_fraction=0.1)
    train, val = list(iter_documents(data, "train")), list(iter_documents(data, "validation"))
    everything = list(iter_documents(data, None))
    assert len(everything) == 2000 and sorted(train + val) == sorted(everything)
    assert not set(train) & set(val)
    assert 0.07 < len(val) / len(everything) < 0.13
    assert all(is_validation(doc, 0.1) for doc in val)


def test_two_workers_read_disjoint_documents_of_one_file(wiki_data: Callable[..., DataConfig]) -> None:
    data = wiki_data()
    assert num_shards(data) == 1  # one file: workers take every other document
    shares = [list(iter_documents(data, None, worker=w, num_workers=2)) for w in range(2)]
    assert not set(shares[0]) & set(shares[1])
    everything = list(iter_documents(data, None))
    assert sorted(shares[0] + shares[1]) == sorted(everything)
    loaded = DataLoader(DocumentStream(data, None), batch_size=None, num_workers=2)
    assert sorted(loaded) == sorted(everything)
    shuffled = [list(iter_documents(data, None, worker=w, num_workers=2, shuffle_seed=5, epoch=1)) for w in (0, 1)]
    assert sorted(shuffled[0] + shuffled[1]) == sorted(everything) and shuffled != shares


def test_two_workers_read_disjoint_shards(tmp_path: Path) -> None:
    for k in range(3):
        (tmp_path / f"part{k}.txt").write_text("\n\n".join(f"Doc {k}-{i}." for i in range(50)), encoding="utf-8")
    data = _cfg(tmp_path)
    loaded = list(DataLoader(DocumentStream(data, None), batch_size=None, num_workers=2))
    assert len(loaded) == len(set(loaded)) == 150
    ranks = [
        set(iter_documents(data, None, rank=r, world_size=2, worker=w, num_workers=2)) for r in (0, 1) for w in (0, 1)
    ]
    assert sum(len(r) for r in ranks) == 150 and len(set().union(*ranks)) == 150


def test_ddp_ranks_read_disjoint_documents(wiki_data: Callable[..., DataConfig]) -> None:
    data = wiki_data()
    shares = [set(iter_documents(data, "train", rank=r, world_size=2, shuffle_seed=1, epoch=2)) for r in (0, 1)]
    assert not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(iter_documents(data, "train"))


def test_shuffled_stream_reads_one_shard_at_a_time(tmp_path: Path) -> None:
    """Memory stays flat in the number of shards: the shuffle buffer is fed by one shard at a
    time (``datasets`` would otherwise open up to 10 readers at once), in a seeded shard order."""
    for k in range(4):
        (tmp_path / f"part{k}.txt").write_text("\n\n".join(f"Doc {k}-{i}." for i in range(600)), encoding="utf-8")
    data = _cfg(tmp_path)

    def firsts(seed: int, epoch: int) -> dict[str, int]:
        """Stream position of each shard's first document, in stream order."""
        shards = [doc.split("-")[0] for doc in iter_documents(data, None, shuffle_seed=seed, epoch=epoch)]
        assert len(shards) == 2400
        return dict(sorted(((s, shards.index(s)) for s in set(shards)), key=lambda item: item[1]))

    # A shard is opened only when the one before is used up: its first document cannot come out
    # before the earlier shards' documents, less what the buffer still holds.
    for k, first in enumerate(firsts(0, 0).values()):
        assert first >= 600 * k - DOC_SHUFFLE_BUFFER, firsts(0, 0)
    orders = {tuple(firsts(seed, epoch)) for seed in range(3) for epoch in range(2)}
    assert len(orders) > 1  # the shard order itself is shuffled by seed and epoch
