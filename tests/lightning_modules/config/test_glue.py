"""The GLUE table: nine tasks by hub name, each a valid ``finetune`` section with GLUE's metrics, and
the score as the papers average it; the kinds' checks of a ``finetune`` section."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.glue import BERT_AVERAGE, GLUE, LEADERBOARD, counted, suite
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.task_kinds import KIND_METRICS


def test_the_nine_tasks_by_hub_name_with_glues_metrics():
    assert list(GLUE) == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
    assert {name: task.hub for name, task in GLUE.items()}["cola"] == "nyu-mll/glue:cola"
    metrics = {name: task.metrics for name, task in GLUE.items()}
    assert metrics == {
        "cola": ("mcc",),
        "sst2": ("accuracy",),
        "mrpc": ("f1", "accuracy"),
        "qqp": ("f1", "accuracy"),
        "stsb": ("pearson", "spearman"),
        "mnli": ("accuracy",),
        "qnli": ("accuracy",),
        "rte": ("accuracy",),
        "wnli": ("accuracy",),
    }
    pairs = {name for name, task in GLUE.items() if len(task.text_fields) == 2}
    assert pairs == set(GLUE) - {"cola", "sst2"}
    assert GLUE["stsb"].kind == "regression" and GLUE["stsb"].num_labels == 1 and GLUE["stsb"].label_names is None
    assert GLUE["mnli"].num_labels == 3 and GLUE["mnli"].label_names == ("entailment", "neutral", "contradiction")
    assert [(d.split, d.name) for d in GLUE["mnli"].dev_sets] == [
        ("validation_matched", "mnli"),
        ("validation_mismatched", "mnli-mm"),
    ]
    assert [(d.split, d.name) for d in GLUE["rte"].dev_sets] == [("validation", "rte")]


@pytest.mark.parametrize("name", list(GLUE))
def test_each_task_is_a_valid_finetune_section_of_its_kind(name):
    task = GLUE[name]
    cfg = build_config({"finetune": {**task.finetune_fields(), "source": "runs:/x"}, "regime": "finetune"}).finetune
    assert cfg.task == name and cfg.train == f"nyu-mll/glue:{name}" and cfg.kind == task.kind
    assert cfg.metric == task.metrics[0] and cfg.score_metrics == task.metrics
    assert set(task.metrics) <= set(KIND_METRICS[task.kind])
    assert cfg.num_labels == task.num_labels and cfg.text_fields == task.text_fields
    assert cfg.max_length == 128 and 0 < cfg.val_every <= cfg.max_steps
    assert [d.name for d in cfg.extra_validation] == [d.name for d in task.dev_sets[1:]]


def test_the_papers_settings_per_task():
    r = {name: (t.recipe.lr, t.recipe.batch_size, t.recipe.max_steps) for name, t in GLUE.items()}
    assert r["mrpc"] == (2e-5, 32, 800) and r["mnli"] == (3e-5, 128, 10000) and r["cola"] == (1e-5, 16, 5336)


def test_the_leaderboards_score_is_the_mean_of_task_scores_without_wnli_by_default():
    best = {"mrpc/best_score": 0.8, "stsb/best_score": 0.6, "wnli/best_score": 0.1, "mytask/best_score": 0.0}
    devs = {"mrpc": ("mrpc",), "stsb": ("stsb",), "wnli": ("wnli",)}
    assert counted(["mrpc", "stsb", "wnli", "mytask"]) == ["mrpc", "stsb"]
    assert LEADERBOARD.average(best, devs) == pytest.approx(0.7)
    assert LEADERBOARD.average(best, devs, wnli=True) == pytest.approx(0.5)
    assert LEADERBOARD.average(best, {}) is None
    assert LEADERBOARD.average(best, {"rte": ("rte",)}) is None  # a task's figure missing: no score
    assert "wnli" not in suite() and len(suite()) == 8 and suite(wnli=True) == tuple(GLUE)


# BERT-base's GLUE test figures, Table 1 of Devlin et al. (2019): the "Average" column is 79.6
BERT_BASE = {
    "mnli/best_accuracy": 84.6, "mnli-mm/best_accuracy": 83.4, "qqp/best_f1": 71.2, "qnli/best_accuracy": 90.5,
    "sst2/best_accuracy": 93.5, "cola/best_mcc": 52.1, "stsb/best_spearman": 85.8, "mrpc/best_f1": 88.9,
    "rte/best_accuracy": 66.4, "wnli/best_accuracy": 65.1,
}  # fmt: skip


def test_berts_average_is_its_table_1_column_average():
    devs = {name: tuple(d.name for d in task.dev_sets) for name, task in GLUE.items()}
    assert round(BERT_AVERAGE.average(BERT_BASE, devs, wnli=True), 1) == 79.6  # WNLI never counts
    assert GLUE["stsb"].paper_metric == "spearman" and GLUE["mrpc"].paper_metric == "f1"
    # the leaderboard's convention over the same tasks: MNLI's score is the mean of m and mm
    scores = {f"{name}/best_score": v for name, v in [("mnli", 84.0), ("rte", 66.0)]}
    assert LEADERBOARD.average(scores, {"mnli": ("mnli", "mnli-mm"), "rte": ("rte",)}) == pytest.approx(75.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "regression", "metric": "pearson"}, "num_labels: 2: a regression task has one output"),
        ({"kind": "regression", "num_labels": 1}, "metric: 'accuracy' does not score a regression task"),
        ({"metric": "pearson"}, "metric: 'pearson' does not score a classification task"),
        ({"score_metrics": ["accuracy", "spearman"]}, "score_metrics: 'spearman' does not score"),
        ({"num_labels": 1}, "num_labels: 1: a classification task has 2 classes or more"),
        ({"label_names": ["a"]}, "label_names: 1 names for num_labels 2"),
        ({"kind": "regression", "num_labels": 1, "metric": "pearson", "exits": True}, "exits: FastBERT's exits"),
        ({"task": "mnli", "extra_validation": [{"name": "mnli"}]}, "extra_validation: dev sets must have names"),
    ],
)
def test_a_metric_must_score_the_tasks_kind(fields, message):
    with pytest.raises(ValidationError, match=message):
        FinetuneConfig(**fields)


def test_a_regression_task_is_one_output_scored_by_correlation():
    cfg = FinetuneConfig(kind="regression", num_labels=1, metric="spearman", score_metrics=("pearson", "spearman"))
    assert cfg.num_labels == 1 and cfg.metric == "spearman"
