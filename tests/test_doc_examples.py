"""Every fenced block of the README and docs/ is marked with its kind (docs/development.md, "Examples in the
docs"), and checked as it says: excerpts load as what they are part of, and the runs blocks run as a reader
would run them, at a smoke size set through the documented overrides, printing the output the docs show."""

from __future__ import annotations

import ast
import copy
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from ablate.cli import parse_args
from ablate.lightning_modules.config.load import build_config
from ablate.reports.spec import ReportSpec
from ablate.sweeps.spec import load_study
from tests.conftest import SHARED_DATA
from tests.doc_examples import Block, Kind, Session, all_blocks, block, commands, is_ablate, unmet

BLOCKS = all_blocks()
RUN_BY = {
    ("README.md", "tour"): "test_the_first_session_runs_and_prints_where_its_report_is",
    ("docs/getting-started.md", "first-session"): "test_the_first_session_runs_and_prints_where_its_report_is",
    ("docs/configuration.md", "tiny-albert.yaml"): "test_the_first_session_runs_and_prints_where_its_report_is",
    ("docs/configuration.md", "train-tiny-albert"): "test_the_first_session_runs_and_prints_where_its_report_is",
    ("docs/configuration.md", "overrides"): "test_the_first_session_runs_and_prints_where_its_report_is",
    ("docs/configuration.md", "errors"): "test_the_quick_commands_print_what_the_docs_show",
    ("docs/accounting.md", "params-json"): "test_the_quick_commands_print_what_the_docs_show",
    ("docs/getting-started.md", "report-before-sweep"): "test_the_quick_commands_print_what_the_docs_show",
    ("docs/reports.md", "report-before-sweep"): "test_the_quick_commands_print_what_the_docs_show",
    ("docs/studies.md", "check-schubert"): "test_the_quick_commands_print_what_the_docs_show",
    ("docs/studies.md", "check-old"): "test_the_quick_commands_print_what_the_docs_show",
    ("docs/data.md", "catalog.yaml"): "test_the_data_catalog_examples_run",
    ("docs/data.md", "check-and-sweep"): "test_the_data_catalog_examples_run",
    ("docs/data.md", "slices.yaml"): "test_the_data_catalog_examples_run",
    ("docs/data.md", "bad-catalogs"): "test_the_data_catalog_examples_run",
    ("docs/guides/quantization.md", "smallest-within-a-point.yaml"): "test_the_accuracy_guard_example_runs",
    ("docs/guides/quantization.md", "guarded-sweep"): "test_the_accuracy_guard_example_runs",
    ("docs/guides/interop.md", "export-onnx"): "test_the_onnx_export_and_its_snippet_run",
    ("docs/guides/interop.md", "use.py"): "test_the_onnx_export_and_its_snippet_run",
}
"""Each runs block (page, name) and the test of this module that runs it."""
SMALL = {"trainer.max_steps": "2", "trainer.val_every": "2", "trainer.val_batches": "1"}
"""The smoke size of a pre-training run or study: two steps, validated once on one batch."""
needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared test data not found at {SHARED_DATA}")


def _of(kind: Kind) -> list[Block]:
    return [b for b in BLOCKS if b.kind is kind]


def _ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


def test_every_block_is_marked_with_a_kind():
    assert len(BLOCKS) > 80  # the reader finds the blocks
    unmarked = [f"{b.where}: no <!-- example: KIND --> on the line before" for b in BLOCKS if b.marker is None]
    unknown = [f"{b.where}: unknown kind '{b.marker}'" for b in BLOCKS if b.marker is not None and b.kind is None]
    assert unmarked + unknown == []


def test_every_runs_block_is_run_and_every_output_block_has_one():
    runs = {(b.page, b.name) for b in _of(Kind.RUNS)}
    assert runs == set(RUN_BY), "runs blocks and RUN_BY differ"
    assert set(RUN_BY.values()) <= set(globals()), "RUN_BY names a test this module lacks"
    orphans = [b.where for b in _of(Kind.OUTPUT) if (b.page, b.name) not in runs]
    assert orphans == [], "output of no runs block of the page"


def _filled(tree: object) -> object:
    """A YAML excerpt with what the docs leave to the reader (``...``, ``runs:/RUN_ID``) left out."""
    if isinstance(tree, dict):
        return {k: _filled(v) for k, v in tree.items() if k != "..." and v != "..."}
    if isinstance(tree, list):
        return [_filled(v) for v in tree if v != "..."]
    return tree


def _here(text: str) -> str:
    """An excerpt with the docs' data folder (``/data/``) where the data is here."""
    return text.replace("/data/", f"{SHARED_DATA}/")


def _yaml(b: Block) -> dict[str, object]:
    tree = _filled(yaml.safe_load(_here(b.text)))
    assert isinstance(tree, dict), f"{b.where}: not a mapping"
    return tree


@pytest.mark.parametrize("b", _of(Kind.CONFIG), ids=_ids(_of(Kind.CONFIG)))
def test_config_excerpts_load(b: Block):
    tree = _yaml(b)
    if "finetune" in tree and "regime" not in tree:
        tree["regime"] = "finetune"
    cfg = build_config(tree)
    assert all(getattr(cfg, section) is not None for section in tree if section != "regime")


STUDY_FRAME = {"name": "excerpt", "base": {"model": {"preset": "albert-tiny"}}}
"""What a study excerpt is part of, where it is a part: a study of a tiny ALBERT and nothing else."""


@pytest.mark.parametrize("b", _of(Kind.STUDY), ids=_ids(_of(Kind.STUDY)))
def test_study_excerpts_load(b: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "data").symlink_to(SHARED_DATA)  # data/sst2/train.tsv, relative, as the docs write it
    monkeypatch.chdir(tmp_path)
    tree = {**copy.deepcopy(STUDY_FRAME), **_yaml(b)}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    spec, _ = load_study(path)
    assert spec.name == tree["name"]


REPORT_FRAME = {"title": "excerpt", "rows": ["model.sharing"], "metrics": [{"name": "val/loss"}]}


@pytest.mark.parametrize("b", _of(Kind.REPORT), ids=_ids(_of(Kind.REPORT)))
def test_report_excerpts_validate(b: Block):
    spec = ReportSpec.from_mapping({**REPORT_FRAME, **_yaml(b)}, where=b.where)
    assert spec.title == "excerpt"


@pytest.mark.parametrize("b", _of(Kind.CATALOG), ids=_ids(_of(Kind.CATALOG)))
def test_catalog_excerpts_load(b: Block, tmp_path: Path):
    from ablate.datamodules.catalog import load_catalog

    path = tmp_path / "catalog.yaml"
    path.write_text(_here(b.text), encoding="utf-8")
    catalog = load_catalog(path)
    tree = _yaml(b)
    assert set(catalog.models) == set(tree.get("models") or {})  # type: ignore[call-overload]


@pytest.mark.parametrize("b", _of(Kind.COMMANDS), ids=_ids(_of(Kind.COMMANDS)))
def test_command_excerpts_parse(b: Block):
    found = [c for c in commands(_here(b.text)) if c.argv]
    assert found, f"{b.where}: no command"
    for command in found:
        assert is_ablate(command), f"{b.where}: {command.text}: not an ablate command (mark the block shown)"
        assert parse_args(list(command.argv[1:])).func is not None


@pytest.mark.parametrize("b", _of(Kind.PYTHON), ids=_ids(_of(Kind.PYTHON)))
def test_python_excerpts_compile_and_their_imports_import(b: Block):
    tree = ast.parse(b.text, filename=b.where)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports, f"{b.where}: imports nothing"
    exec(compile(ast.Module(body=imports, type_ignores=[]), b.where, "exec"), {})  # noqa: S102


def _commands(b: Block) -> list[tuple[str, ...]]:
    return [c.argv for c in commands(b.text) if c.argv]


def test_the_first_session_runs_and_prints_where_its_report_is(tmp_path: Path):
    """The README's tour (the getting-started page's first session is the same commands) and the
    configuration page's tiny ALBERT, in one folder: each run at two steps, the quickstart at two trials."""
    session, tour = Session(tmp_path), block("README.md", "tour")
    assert set(_commands(block("docs/getting-started.md", "first-session"))) <= set(_commands(tour))
    said = session.run(
        tour,
        {
            "train albert-tiny data.max_length=64 trainer.max_steps=300": SMALL,
            "sweep sweeps/studies/quickstart.yaml": {**SMALL, "name": "quickstart", "--n-trials": "2"},
        },
    )
    store = MlflowClient(f"sqlite:///{tmp_path / 'ablate-runs' / 'mlflow.db'}")
    quickstart = store.get_experiment_by_name("quickstart")
    assert quickstart is not None, said[-3000:]
    for shown in (
        block("README.md", "tour", Kind.OUTPUT),
        block("docs/getting-started.md", "first-session", Kind.OUTPUT),
    ):
        # the study's experiment: 1 in the fresh store of make quickstart, the second here (after ablate train)
        text = shown.text.replace("#/experiments/1/", f"#/experiments/{quickstart.experiment_id}/")
        text = text.replace("/path/to/ablate/.venv/bin/", f"{Path(sys.executable).parent}/")  # any venv's mlflow
        assert unmet(text, said) == [], said[-3000:]
    assert (tmp_path / "ablate-runs" / "reports" / "quickstart" / "report.md").is_file()

    session.write(block("docs/configuration.md", "tiny-albert.yaml"))
    said = session.run(block("docs/configuration.md", "train-tiny-albert"), {"train tiny-albert.yaml": SMALL})
    said += session.run(
        block("docs/configuration.md", "overrides"),
        {"train tiny-albert.yaml model.embed_dim=32 trainer.max_steps=1000": SMALL},
    )
    experiment = store.get_experiment_by_name("tiny-albert")
    assert experiment is not None, said[-2000:]
    runs = store.search_runs([experiment.experiment_id])
    embed = sorted(r.data.params["model.embed_dim"] for r in runs)
    assert embed == ["128", "32"], said[-2000:]  # the file's E, and E overridden on the command line


@needs_data
def test_the_quick_commands_print_what_the_docs_show(tmp_path: Path):
    """Commands of a second or two, each printing the line its page shows (a report before any run in a
    folder without a store; the study checks through the session's data catalog)."""
    session = Session(tmp_path)
    session.run(block("docs/accounting.md", "params-json"))
    session.run(block("docs/getting-started.md", "report-before-sweep"))
    session.run(block("docs/reports.md", "report-before-sweep"))
    assert not (tmp_path / "ablate-runs").exists()  # a report of nothing writes nothing
    session.run(block("docs/studies.md", "check-schubert"))
    old = yaml.safe_load((session.folder / "sweeps" / "studies" / "quickstart.yaml").read_text(encoding="utf-8"))
    old["objective"] = old.pop("optimize")  # the key's old name
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old), encoding="utf-8")
    session.run(block("docs/studies.md", "check-old"))
    session.write(block("docs/configuration.md", "tiny-albert.yaml"))
    session.run(block("docs/configuration.md", "errors"))
    assert not (tmp_path / "ablate-runs").exists()  # refused before anything is written


@needs_data
def test_the_data_catalog_examples_run(tmp_path: Path):
    """docs/data.md's catalog over the data here: a shipped study checks and smoke-runs through it; the
    slices read the rows and questions their comments count; the broken catalogs say what the page shows."""
    from ablate.datamodules import squad
    from ablate.datamodules.provenance import task_data
    from ablate.datamodules.task_rows import read_split
    from tests.doc_examples import environment

    (tmp_path / "here").mkdir()
    here = Session(tmp_path / "here", {"/data/catalog.yaml": str(tmp_path / "here" / "catalog.yaml")})
    here.replace = {**here.replace, "/data/": f"{SHARED_DATA}/"}
    here.write(block("docs/data.md", "catalog.yaml"))
    here.run(block("docs/data.md", "check-and-sweep"), {"sweep sweeps/studies/albert_table4.yaml": {"--smoke": ""}})

    slices = here.write(block("docs/data.md", "slices.yaml"))
    with environment({"ABLATE_DATA_CATALOG": str(slices)}):
        span = {"source": "x", "task": "squad", "kind": "span", "train": "rajpurkar/squad"}
        found = task_data(build_config({"regime": "finetune", "finetune": span}).finetune)
        assert found is not None
        questions = [len(squad.read_questions(split, None, no_answer=False)) for split in found]
        mnli = build_config({"regime": "finetune", "finetune": {"source": "x", "glue": "mnli"}}).finetune
        rows = [len(read_split(split, mnli, None)[0][0]) for split in task_data(mnli) or ()]
    assert questions == [7766, 2804] and "(2,804 + 7,766 questions)" in block("docs/data.md", "slices.yaml").text
    assert rows == [5000, 4815] and "9,815 dev rows: 5,000 to train on" in block("docs/data.md", "slices.yaml").text

    empty = tmp_path / "empty"  # a catalog whose files are not there
    empty.mkdir()
    bad = Session(empty, {"/data/": f"{empty}/"})
    bad.env["ABLATE_DATA_CATALOG"] = str(bad.write(block("docs/data.md", "catalog.yaml")))
    bad.run(block("docs/data.md", "bad-catalogs"))


def test_the_accuracy_guard_example_runs(tmp_path: Path):
    """The quantization guide's guarded study, written and run as the guide says (its reference pre-trained
    two steps), ends with the chosen trial, and its report has the Pareto section and pareto.csv."""
    session = Session(tmp_path)
    session.write(block("docs/guides/quantization.md", "smallest-within-a-point.yaml"))
    said = session.run(
        block("docs/guides/quantization.md", "guarded-sweep"),
        {"sweep smallest-within-a-point.yaml": {**SMALL, "name": "smallest-within-a-point"}},
    )
    assert re.search(r"^chosen trial \d+", said, re.M), said[-2000:]
    report = tmp_path / "ablate-runs" / "reports" / "smallest-within-a-point"
    assert "## Accuracy guard: the Pareto front" in (report / "report.md").read_text(encoding="utf-8")
    assert len(pd.read_csv(report / "pareto.csv")) == 4  # fp32, int8, int4, int3


def _sst2_classifier(folder: Path) -> str:
    """A tiny BERT (random weights, a vocabulary trained on SST-2's sentences) fine-tuned four steps on
    SST-2 (``max_length`` 128, as the interop page's card) by ablate's own run in ``folder``'s store."""
    from ablate.datamodules.tokenizer import train_tokenizer
    from ablate.lightning_modules.interop.export import export
    from ablate.lightning_modules.model.heads import build_pretraining_model
    from ablate.sweeps.engine.runner import train

    rows = (SHARED_DATA / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:2000]
    train_tokenizer([r.split("\t")[0] for r in rows], vocab_size=1000, lowercase=True).save(str(folder / "tok.json"))
    model = {"preset": "bert-tiny", "num_layers": 2, "vocab_size": 1000, "hidden_dim": 64, "num_heads": 2}
    model |= {"ffn_dim": 128, "max_position": 128}
    cfg = build_config({"model": model})
    export(build_pretraining_model(cfg.model, cfg.objective), cfg, folder / "source", tokenizer=folder / "tok.json")
    finetune = {"task": "sst2", "train": "nyu-mll/glue:sst2", "source": str(folder / "source"), "max_length": 128}
    finetune |= {"batch_size": 16, "max_steps": 4, "val_every": 4, "validation_examples": 64}
    tree = {"model": model, "finetune": finetune, "data": {"num_workers": 0}}
    tree |= {"trainer": {"measure": False, "progress": False}, "tracking": {"root": str(folder / "ablate-runs")}}
    return train(build_config(tree)).run_id


@needs_data
def test_the_onnx_export_and_its_snippet_run(tmp_path: Path):
    """The interop page's ONNX export of a fine-tuned SST-2 classifier prints the line the page shows; the
    page's ``## Use`` snippet is the card's, and runs as written from the export's folder (no torch)."""
    pytest.importorskip("onnxruntime")
    out = tmp_path / "OUT"
    run_id = _sst2_classifier(tmp_path)
    replace = {"5c1f...": "...", "RUN_ID": run_id, "/abs/OUT_DIR": str(out), "OUT_DIR": str(out)}
    session = Session(tmp_path, replace)
    said = session.run(block("docs/guides/interop.md", "export-onnx"))
    assert unmet(session.text(block("docs/guides/interop.md", "export-onnx", Kind.OUTPUT)), said) == []

    use = block("docs/guides/interop.md", "use.py")
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"```python\n{use.text}```" in card, "the page's snippet is not the card's"
    (out / use.name).write_text(use.text, encoding="utf-8")
    ran = subprocess.run([sys.executable, use.name], cwd=out, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    lines = [line.split("\t") for line in ran.stdout.splitlines()]
    assert [line[2] for line in lines] == ["A gripping, moving film.", "A dull, lifeless script that goes nowhere."]
    assert all(line[0] in ("negative", "positive") and 0.5 <= float(line[1]) <= 1 for line in lines)
