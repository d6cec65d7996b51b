"""``ablate bench loop --regime finetune --task NAME`` on tiny real runs: a GLUE pair task and SQuAD read
through the data catalog by their hub names, the task named in the table; a task the catalog does
not map refused in one line before anything runs. No timed assertion: speed is the benchmark's job."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from ablate.benchmarks.cases import CASES, Case
from ablate.benchmarks.finetune_tasks import glue_config, squad_config
from ablate.benchmarks.loop import measure, report
from ablate.benchmarks.regimes import TaskChoice
from tests.conftest import SHARED_DATA, documented_catalog

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def catalog(data_catalog):
    """The session's catalog (the documented one, with stand-ins for the splits not here: SQuAD's train
    split is its dev file)."""
    if data_catalog is None:
        pytest.skip("the shared data (and its catalog) is not here")
    return data_catalog


@pytest.fixture
def documented(catalog, tmp_path, monkeypatch):
    """The catalog exactly as docs/data.md documents it for the shared data: SQuAD's dev files only."""
    path = tmp_path / "documented.yaml"
    path.write_text(documented_catalog(SHARED_DATA), encoding="utf-8")
    monkeypatch.setenv("ABLATE_DATA_CATALOG", str(path))
    return path


def _tiny() -> Case:
    """bert-tiny at a test's size: one layer, a 2048-token vocabulary, T=32."""
    case = CASES["bert-tiny"]()
    return replace(case, model=replace(case.model, vocab_size=2048, num_layers=1, max_position=32), seq_len=32, batch=4)


@pytest.mark.parametrize(
    ("task", "origin", "kind"),
    [
        ("mrpc", "MRPC (nyu-mll/glue:mrpc train, through the data catalog)", "classification"),
        ("squad", "SQuAD v1.1 (rajpurkar/squad: only its dev file is mapped: its first 224 questions train", "span"),
    ],
)
def test_a_task_runs_and_its_table_names_it(task, origin, kind, documented, wiki_validation):
    r = measure(_tiny(), str(wiki_validation), torch.device("cpu"), 2, 5, 1, regime="finetune", choice=TaskChoice(task))
    assert r.cfg.finetune.task == task and r.cfg.finetune.kind == kind
    assert r.loop.tokens == r.step.tokens > 0  # the step alone trains on the loop's own batches
    lines, _ = report(r, "wiki")
    assert lines[0].startswith(f"### bert-tiny: ablate train --regime finetune --task {task} (fine-tuning: {origin}")
    rows = [line.split("|")[1].strip() for line in lines if line.startswith("| the ")]
    assert rows == ["the loop (ablate train)", "the step alone"]
    for line in lines:
        if line.startswith("| the "):
            assert float(line.split("|")[2].replace(",", "")) > 0  # tokens/s
    found = re.fullmatch(r"loop efficiency: (\d+\.\d\d)", lines[-1])
    assert found and 0 < float(found.group(1)) <= 1.5 and float(found.group(1)) == round(r.efficiency, 2)
    # a span task's windows fill the window: no padding comparison; a pair task has one
    assert any(line.startswith("- padding to the longest row: **") for line in lines) == (kind != "span")


def test_stsb_is_a_regression_of_pairs_from_the_catalog(catalog):
    cfg, origin = glue_config("stsb", "SOURCE", 128, 32, 45)
    assert (cfg.kind, cfg.num_labels, cfg.text_fields, cfg.metric) == (
        "regression",
        1,
        ("sentence1", "sentence2"),
        "pearson",
    )
    assert (cfg.train, cfg.batch_size, cfg.max_length, cfg.max_steps, cfg.val_every) == (
        "nyu-mll/glue:stsb",
        32,
        128,
        45,
        45,
    )
    assert origin == "STSB (nyu-mll/glue:stsb train, through the data catalog)"


def test_squad_v2_trains_on_the_first_dev_questions_and_scores_the_next(documented, tmp_path):
    cfg, origin = squad_config("squad_v2", "SOURCE", 128, 32, 10, tmp_path)
    assert cfg.kind == "span" and cfg.no_answer and cfg.task == "squad_v2"
    assert (cfg.doc_stride, cfg.max_query_length, cfg.batch_size) == (42, 64, 32)
    train = [json.loads(line) for line in (tmp_path / "squad_v2-train.jsonl").read_text().splitlines()]
    dev = [json.loads(line) for line in (tmp_path / "squad_v2-dev.jsonl").read_text().splitlines()]
    assert (len(train), len(dev)) == (320, 160) and cfg.train.endswith("squad_v2-train.jsonl")
    assert not {q["id"] for q in train} & {q["id"] for q in dev}
    assert any(not q["answers"]["text"] for q in train)  # v2.0's unanswerable questions are kept
    assert "its first 320 questions train and the next 160 score, written to temporary files" in origin


def test_squad_trains_on_its_train_split_where_the_catalog_maps_it(catalog, tmp_path):
    cfg, origin = squad_config("squad", "SOURCE", 128, 32, 10, tmp_path)
    assert (cfg.train, cfg.validation, cfg.train_examples, cfg.validation_examples) == (
        "rajpurkar/squad",
        None,
        320,
        160,
    )
    assert not cfg.no_answer and not list(tmp_path.iterdir())  # nothing written
    assert origin == "SQuAD v1.1 (rajpurkar/squad: its first 320 train questions, through the data catalog)"


def _catalog(tmp_path, text: str) -> str:
    path = tmp_path / "catalog.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("argv", "catalog_text", "message"),
    [
        (
            ["--regime", "finetune", "--task", "mrpc"],
            None,
            "error: --task mrpc: the bench reads nyu-mll/glue:mrpc from local copies through the data catalog, "
            "and $ABLATE_DATA_CATALOG is unset",
        ),
        (
            ["--regime", "finetune", "--task", "rte"],
            "datasets:\n  nyu-mll/glue:mrpc:\n    train: x.tsv\n",
            "error: --task rte: nyu-mll/glue:rte is not in the data catalog <catalog>",
        ),
        (
            ["--regime", "finetune", "--task", "mrpc"],
            "datasets:\n  nyu-mll/glue:mrpc:\n    validation: v.tsv\n",
            "error: --task mrpc: nyu-mll/glue:mrpc: ABLATE_DATA_CATALOG: <catalog>: nyu-mll/glue:mrpc has no 'train' "
            "split",
        ),
        (
            ["--regime", "finetune", "--task", "squad"],
            "datasets:\n  rajpurkar/squad:\n    validation: missing.json\n",
            "error: --task squad: rajpurkar/squad: ABLATE_DATA_CATALOG: <catalog>: validation: ",
        ),
        (["--task", "mrpc"], None, "error: --task: only for `ablate bench loop --regime finetune`"),
        (
            ["--regime", "finetune", "--task", "mrpc", "--sst2", "SST2"],
            None,
            "error: --sst2: only for --task sst2",
        ),
    ],
)
def test_an_unreachable_task_is_one_line_and_exit_2(argv, catalog_text, message, tmp_path, monkeypatch, capsys):
    from ablate.cli import main

    (tmp_path / "sst2").mkdir()
    for name in ("train.tsv", "validation.tsv"):
        (tmp_path / "sst2" / name).write_text("sentence\tlabel\ngood\t1\n")
    if catalog_text is None:
        monkeypatch.delenv("ABLATE_DATA_CATALOG", raising=False)
        path = "-"
    else:
        path = _catalog(tmp_path, catalog_text)
        monkeypatch.setenv("ABLATE_DATA_CATALOG", path)
    argv = ["bench", "loop", *(str(tmp_path / "sst2") if a == "SST2" else a for a in argv)]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(message.replace("<catalog>", path)), err
