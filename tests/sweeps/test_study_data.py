"""Studies that run anywhere: every shipped study names its data by hub name, checks with the data
catalog (its names resolved to the local copies) and without it (hub names checked for their form,
and found in the hub cache), and a run through the catalog says which files it read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient

from ablate.cli import main
from ablate.datamodules.catalog import ENV
from ablate.datamodules.provenance import CATALOG_TAG, CORPUS_TAG, task_data
from ablate.datamodules.sources import BUILTIN, resolve_corpus
from ablate.sweeps.spec import corner_configs, load_study
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import tiny_base

ROOT = Path(__file__).resolve().parents[2]
STUDIES = sorted((ROOT / "sweeps" / "studies").glob("*.yaml"))
SHIPPED = ["sweeps", "docs", "reports", "lightning_modules", "datamodules", "benchmarks", "ablate", "tools"]
SHIPPED_FILES = ["README.md", "Makefile", "mkdocs.yml", "pyproject.toml"]


def _hub_cache(path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub cache at ``cache``, holding the hub datasets study ``path`` reads (offline: the hub
    cannot be asked, and a hub name neither mapped nor cached is refused before anything runs)."""
    from huggingface_hub import constants

    from ablate.datamodules import hub_reach

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_reach.hub_answers.cache_clear()
    monkeypatch.delenv(ENV, raising=False)
    spec, base = load_study(path)
    cfg = corner_configs(spec, base)[0]
    names = [t.name for i, task in enumerate(spec.tasks) for t in task_data(task, f"tasks[{i}]") or ()]
    for name in [cfg.data.corpus, *names]:
        if "/" in name and not Path(name).exists():
            (cache / f"datasets--{name.split(':')[0].replace('/', '--')}").mkdir(exist_ok=True)


@pytest.mark.parametrize("with_catalog", [True, False], ids=["catalog", "hub"])
@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_shipped_study_checks_with_and_without_the_catalog(
    path: Path,
    with_catalog: bool,
    data_catalog: Path | None,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if with_catalog and data_catalog is None:
        pytest.skip(f"no local copies at {SHARED_DATA} for the catalog to map the hub names to")
    if not with_catalog:  # a user elsewhere, who has read these hub datasets once: in the hub cache
        monkeypatch.delenv(ENV, raising=False)
        _hub_cache(path, tmp_path_factory.mktemp("hub"), monkeypatch)
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", "--check", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    spec, base = load_study(path)
    line, *more = out.strip().splitlines()
    assert line.startswith(f"study {spec.name}: valid; "), line
    if path.stem.endswith("_gpu"):  # a GPU study also says how long it would take (or why it cannot tell)
        assert more and more[0].startswith("estimated wall time: "), out
    here = re.search(r"; not runnable on this machine \((.*)\)$", line)
    if path.stem.endswith("_gpu") and not torch.cuda.is_available():
        assert here is not None, line  # a GPU profile says why it would not run on this CPU machine
    if here is not None:  # what the machine lacks, never the data
        assert re.search(r": (\w+\.)?(trainer\.|model: )", here.group(1)) and "data" not in here.group(1), line
    assert list(tmp_path.iterdir()) == []  # checked, nothing written

    cfg = corner_configs(spec, base)[0]
    corpus = resolve_corpus(cfg.data.corpus, cfg.data.text_field)
    tasks = [split for i, task in enumerate(spec.tasks) for split in task_data(task, f"tasks[{i}]") or ()]
    if cfg.data.corpus in BUILTIN:
        assert corpus.catalog is None and not tasks  # the offline studies name no hub data
        return
    assert cfg.data.corpus == "wikimedia/wikipedia:20231101.en"
    assert {t.name for t in tasks} <= {
        "nyu-mll/glue:sst2",
        "nyu-mll/glue:mnli",
        "rajpurkar/squad",
        "rajpurkar/squad_v2",
    }
    if with_catalog:
        assert corpus.catalog == str(data_catalog) and corpus.files
        shared = SHARED_DATA.resolve()  # the catalog resolves its files (../shared may be a link)
        assert all(Path(f).is_relative_to(shared / "wiki-en") for f in corpus.files)
        for t in tasks:  # the shared copies (SST-2's splits; the dev files that stand in where a split is not here)
            assert t.catalog == str(data_catalog) and t.files and all(Path(f).is_relative_to(shared) for f in t.files)
        sst2 = [t for t in tasks if t.name == "nyu-mll/glue:sst2"]
        assert all(t.files == (str(shared / "sst2" / f"{t.split}.tsv"),) for t in sst2)
    else:
        assert (corpus.builder, corpus.config_name, corpus.files) == ("wikimedia/wikipedia", "20231101.en", ())
        hub = {"nyu-mll/glue:sst2": ("nyu-mll/glue", "sst2"), "nyu-mll/glue:mnli": ("nyu-mll/glue", "mnli")}
        hub |= {"rajpurkar/squad": ("rajpurkar/squad", None), "rajpurkar/squad_v2": ("rajpurkar/squad_v2", None)}
        assert all((t.builder, t.config, t.files) == (*hub[t.name], ()) for t in tasks), tasks


def test_no_shipped_file_names_a_path_outside_the_repository() -> None:
    files = [ROOT / name for name in SHIPPED_FILES]
    files += [p for folder in SHIPPED for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    named = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="ignore")
        named += [f"{path.relative_to(ROOT)}: {m}" for m in re.findall(r"(?:\.\./shared|/work/shared)\S*", text)]
    assert named == []


def test_a_run_through_the_catalog_is_tagged_with_its_files(
    tmp_path: Path, wiki_validation: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ablate train`` on the hub name of Wikipedia, mapped to one local shard: the run trains on it
    and its tags say which catalog and which file."""
    catalog = tmp_path / "catalog.yaml"
    shard = {"train": str(wiki_validation)}
    catalog.write_text(yaml.safe_dump({"datasets": {"wikimedia/wikipedia:20231101.en": shard}}), encoding="utf-8")
    monkeypatch.setenv(ENV, str(catalog))
    monkeypatch.chdir(tmp_path)
    tree = tiny_base(tmp_path, wiki_validation)
    tree["data"]["corpus"] = "wikimedia/wikipedia:20231101.en"
    tree["trainer"].update(max_steps=2, val_every=2, measure=False)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree), encoding="utf-8")
    assert main(["train", "cfg.yaml"]) == 0, capsys.readouterr().err
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.params["data.corpus"] == "wikimedia/wikipedia:20231101.en"
    assert run.data.tags[CATALOG_TAG] == str(catalog)
    assert run.data.tags[CORPUS_TAG] == f"train split via {ENV} ({catalog}): 1 file: {wiki_validation.resolve()}"
    assert run.data.metrics["val/loss"] > 0
