"""A known task's name fills in what the task is, the same in a train config, a study's task and a
recipe: ``task: mrpc``, a known ``train`` hub dataset alone, ``glue: mrpc`` with the papers' settings;
fields given beside the name win."""

from __future__ import annotations

import pytest

from ablate.cli import main
from ablate.lightning_modules.config.glue import GLUE
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.tasks import KNOWN_TASKS, parse_hub_name, task_of_hub
from ablate.sweeps.study_models import FinetuneTask


def finetune(**fields: object):
    return build_config({"regime": "finetune", "finetune": {"source": "runs:/x", **fields}}).finetune


def test_a_glue_task_by_name_is_its_data_columns_labels_and_metrics():
    cfg = finetune(task="mrpc")
    assert cfg.train == "nyu-mll/glue:mrpc" and cfg.text_fields == ("sentence1", "sentence2")
    assert cfg.label_names == ("not_equivalent", "equivalent") and cfg.metric == "f1"
    assert cfg.score_metrics == ("f1", "accuracy")
    assert (cfg.lr, cfg.max_steps) == (1e-4, 1000)  # the run's own schedule: task names no recipe
    stsb = finetune(task="stsb")
    assert stsb.kind == "regression" and stsb.num_labels == 1 and stsb.metric == "pearson"
    mnli = finetune(task="mnli")
    assert mnli.validation_split == "validation_matched"
    assert [(d.name, d.split) for d in mnli.extra_validation] == [("mnli-mm", "validation_mismatched")]


def test_squad_by_name_is_a_span_task_in_berts_windows():
    v1, v2 = finetune(task="squad"), finetune(task="squad_v2")
    assert (v1.kind, v1.train, v1.metric, v1.no_answer, v1.max_length, v1.doc_stride) == (
        "span",
        "rajpurkar/squad",
        "f1",
        False,
        384,
        128,
    )
    assert v2.no_answer and v2.train == "rajpurkar/squad_v2"


@pytest.mark.parametrize("hub", ["nyu-mll/glue:stsb", "nyu-mll/glue/stsb"])
def test_a_known_hub_dataset_without_a_task_is_that_task(hub):
    cfg = finetune(train=hub)
    assert cfg.task == "stsb" and cfg.kind == "regression" and cfg.train == hub


def test_a_task_of_its_own_on_known_data_keeps_its_name():
    cfg = finetune(task="sst2-td", train="nyu-mll/glue:sst2", lr=3e-4)
    assert cfg.task == "sst2-td" and cfg.label_names == ("negative", "positive") and cfg.lr == 3e-4


def test_fields_given_win_and_an_unknown_task_is_as_given():
    cfg = finetune(task="rte", train="/data/rte/train.tsv", validation="/data/rte/dev.tsv", metric="f1")
    assert cfg.train == "/data/rte/train.tsv" and cfg.metric == "f1" and cfg.text_fields == ("sentence1", "sentence2")
    own = finetune(task="mine", train="/data/mine.tsv", validation="/data/mine-dev.tsv")
    assert own.text_fields == ("sentence",) and own.label_names is None


def test_another_kind_or_label_count_keeps_only_the_tables_data():
    three = finetune(task="sst2", num_labels=3)
    assert three.num_labels == 3 and three.label_names is None and three.text_fields == ("sentence",)
    binned = finetune(task="stsb", kind="classification", num_labels=6)
    assert binned.metric == "accuracy" and binned.text_fields == ("sentence1", "sentence2")


def test_glue_adds_the_papers_settings_in_a_train_config_as_in_a_study():
    cfg = finetune(glue="rte")
    recipe = GLUE["rte"].recipe
    assert (cfg.task, cfg.lr, cfg.batch_size, cfg.max_steps) == ("rte", recipe.lr, recipe.batch_size, recipe.max_steps)
    assert cfg.val_every == recipe.max_steps // 10 and cfg.patience == 10
    assert finetune(glue="rte", max_steps=300).val_every == 30
    study_task = FinetuneTask(glue="rte")
    assert (study_task.task, study_task.lr, study_task.max_steps) == ("rte", recipe.lr, recipe.max_steps)


@pytest.mark.parametrize("name", list(KNOWN_TASKS))
def test_a_studys_task_and_a_run_fill_in_the_same_fields(name):
    study_task = FinetuneTask(task=name)
    run = finetune(task=name)
    for field in KNOWN_TASKS[name]:
        assert getattr(study_task, field) == getattr(run, field), field
    assert task_of_hub(KNOWN_TASKS[name]["train"]) == name


def test_hub_names_however_spelled():
    assert parse_hub_name("nyu-mll/glue:mrpc") == parse_hub_name("nyu-mll/glue/mrpc") == ("nyu-mll/glue", "mrpc")
    assert parse_hub_name("rajpurkar/squad") == ("rajpurkar/squad", None)
    assert task_of_hub("someone/glue:mrpc") is None and task_of_hub(None) is None


def test_print_config_shows_what_the_task_filled_in(tmp_path, capsys):
    config = tmp_path / "mrpc.yaml"
    config.write_text("regime: finetune\nfinetune: {source: runs:/abc, task: mrpc}\n")
    assert main(["train", str(config), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "  - sentence1\n  - sentence2\n" in out and "  - not_equivalent\n" in out
