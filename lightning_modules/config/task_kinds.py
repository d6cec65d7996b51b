"""What a fine-tuning task predicts (its kind) and the dev metrics that score each kind."""

from __future__ import annotations

from typing import Literal

Metric = Literal["accuracy", "f1", "mcc", "pearson", "spearman", "exact"]
SPAN_METRICS = ("exact", "f1")
"""A span task's metrics: SQuAD's exact match and token F1 (``f1`` scores classification too: macro F1)."""
Kind = Literal["classification", "regression", "span"]
"""What a task predicts: a class (cross-entropy), a number (one output, MSE; GLUE's STS-B) or an answer
span in a context (SQuAD's start and end logits)."""
KIND_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "f1", "mcc"),
    "regression": ("pearson", "spearman"),
    "span": SPAN_METRICS,
}
"""The dev metrics of each kind: what ``finetune.metric`` and ``finetune.score_metrics`` may name.
Classification: accuracy, F1 (of class 1 with two classes, as GLUE scores MRPC and QQP; macro F1 with
more), Matthews correlation; regression: Pearson's and Spearman's correlation with the labels."""
