"""The GLUE table: nine tasks by hub name, each a valid ``finetune`` section with GLUE's metrics, and
the score as the papers average it; the kinds' checks of a ``finetune`` section."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablate.lightning_modules.config.finetune import KIND_METRICS, FinetuneConfig
from ablate.lightning_modules.config.glue import GLUE, counted, glue_score, suite
from ablate.lightning_modules.config.load import build_config


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


def test_the_glue_score_is_the_mean_of_task_scores_without_wnli_by_default():
    scores = {"mrpc": 0.8, "stsb": 0.6, "wnli": 0.1, "mytask": 0.0}
    assert counted(scores) == {"mrpc": 0.8, "stsb": 0.6}
    assert glue_score(scores) == pytest.approx(0.7)
    assert glue_score(scores, wnli=True) == pytest.approx(0.5)
    assert glue_score({"mytask": 1.0}) is None
    assert "wnli" not in suite() and len(suite()) == 8 and suite(wnli=True) == tuple(GLUE)


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
