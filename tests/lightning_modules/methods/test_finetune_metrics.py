"""The fine-tuning dev metrics equal the reference scorers, with the reference in the test: accuracy, F1
and MCC against scikit-learn (what GLUE's own scorer uses), Pearson and Spearman against scipy in float64,
on ordinary and degenerate predictions (one class predicted, constant outputs, ties)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.stats
import torch
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from ablate.lightning_modules.methods.finetune import METRICS, computed

RNG = np.random.default_rng(0)


def _score(name: str, classes: int, preds: np.ndarray, labels: np.ndarray, batches: int = 3) -> float:
    """The module's metric over ``batches`` updates, as a validation epoch feeds it."""
    metric = METRICS[name](classes)
    for p, y in zip(np.array_split(preds, batches), np.array_split(labels, batches), strict=True):
        metric.update(torch.from_numpy(p), torch.from_numpy(y))
    return float(computed(metric))


CLASSIFICATION = {
    "random binary": (2, RNG.integers(0, 2, 200), RNG.integers(0, 2, 200)),
    "one class predicted (MRPC's majority)": (2, np.ones(200, dtype=np.int64), RNG.integers(0, 2, 200)),
    "one class in the labels": (2, RNG.integers(0, 2, 200), np.zeros(200, dtype=np.int64)),
    "all right": (2, np.arange(200) % 2, np.arange(200) % 2),
    "all wrong": (2, np.arange(200) % 2, 1 - np.arange(200) % 2),
    "three classes (MNLI)": (3, RNG.integers(0, 3, 300), RNG.integers(0, 3, 300)),
    "three classes, one predicted": (3, np.full(300, 2), RNG.integers(0, 3, 300)),
}


@pytest.mark.parametrize("case", list(CLASSIFICATION))
def test_classification_metrics_equal_scikit_learn(case: str) -> None:
    classes, preds, labels = CLASSIFICATION[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's note on an ill-defined F1: its value is still the reference
        f1 = f1_score(labels, preds, average="binary" if classes == 2 else "macro", zero_division=0)
        mcc = matthews_corrcoef(labels, preds)
    assert _score("accuracy", classes, preds, labels) == pytest.approx(accuracy_score(labels, preds), abs=1e-7)
    assert _score("f1", classes, preds, labels) == pytest.approx(f1, abs=1e-7)
    assert _score("mcc", classes, preds, labels) == pytest.approx(mcc, abs=1e-12)


def test_a_majority_class_model_scores_exactly_zero_mcc() -> None:
    _, preds, labels = CLASSIFICATION["one class predicted (MRPC's majority)"]
    assert _score("mcc", 2, preds, labels) == 0.0 == matthews_corrcoef(labels, preds)


REGRESSION = {
    "random": (RNG.normal(2.5, 1.0, 300), RNG.uniform(0, 5, 300)),
    "correlated": (np.linspace(0, 5, 300) + RNG.normal(0, 0.3, 300), np.linspace(0, 5, 300)),
    "ties (STS-B's scores in fifths)": (np.round(RNG.uniform(0, 5, 300) * 5) / 5, np.round(RNG.uniform(0, 5, 300))),
}


@pytest.mark.parametrize("case", list(REGRESSION))
def test_correlations_equal_scipy_in_float64(case: str) -> None:
    preds, labels = REGRESSION[case]
    assert _score("pearson", 1, preds, labels) == pytest.approx(scipy.stats.pearsonr(preds, labels)[0], abs=1e-12)
    assert _score("spearman", 1, preds, labels) == pytest.approx(scipy.stats.spearmanr(preds, labels)[0], abs=1e-12)


def test_a_constant_output_correlates_zero_where_scipy_is_undefined() -> None:
    labels = RNG.uniform(0, 5, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns that the correlation of a constant input is undefined
        assert np.isnan(scipy.stats.pearsonr(np.full(100, 2.0), labels)[0])
    assert _score("pearson", 1, np.full(100, 2.0), labels) == 0.0  # counted as following nothing
    assert _score("spearman", 1, np.full(100, 2.0), labels) == 0.0
