"""The names of the metrics runs log, written once: the modules log them under these names, a
study's objective is checked against them before it runs, and every metric logged outside
Lightning's loop (``ablate.sweeps.engine.context.ActiveRun.log``) is checked by :func:`check_name`.
Which run logs which: docs/configuration.md (studies) and docs/guides/finetuning.md."""

from __future__ import annotations

VAL_LOSS = "val/loss"
VAL_MLM_LOSS = "val/mlm_loss"
VAL_MLM_ACC = "val/mlm_acc"
VAL_MLM_PPL = "val/mlm_ppl"
VAL_SENTENCE_ACC = "val/sentence_acc"
VALIDATION = (VAL_LOSS, VAL_MLM_LOSS, VAL_MLM_ACC, VAL_MLM_PPL)
"""What every pre-trained model's validation logs (``val/sentence_acc`` too with a sentence task)."""
DOWNSTREAM_AVG = "downstream/avg"
"""A chained trial's mean over its tasks of each task's best metric."""
SCORE = "score"
"""``<task>/score``: a task's score, the mean of its ``finetune.score_metrics`` over its dev sets (GLUE's)."""
GLUE_SCORE = "glue/score"
"""A chained trial's GLUE score as the leaderboard makes it: the mean over its GLUE tasks of ``<task>/best_score``
(WNLI as the study says)."""
GLUE_BERT_AVG = "glue/bert_avg"
"""A chained trial's average as BERT's Table 1 makes it: one metric per GLUE task, MNLI-m and -mm apart, no WNLI."""
GLUE_TASKS = "glue/tasks"
"""How many GLUE tasks ``glue/score`` averages (8 for the whole benchmark without WNLI)."""
TASK_STAGES = ("", "best_", "final_")
"""``<task>/<stage><metric>``: each validation's, the best one's, the shipped classifier's."""


def task_metrics(task: str, metric: str) -> tuple[str, ...]:
    """The names a fine-tuning task's run returns for its ``finetune.metric``, and its score."""
    return tuple(f"{task}/{stage}{name}" for name in (metric, SCORE) for stage in TASK_STAGES[:2]) + (
        f"{task}/final_{metric}",
    )


NAMESPACES = ("train", "val", "intrinsic", "quant", "prune", "distill", "source", "downstream", "augment", "glue")
"""The first part of every metric name a run logs that is not a fine-tuning task's (``<task>/...``)."""
TOP_LEVEL = ("flops_per_token", "model_bytes", "train_activation_mb", "epoch")
"""Names without a namespace: the accounting of a model (``accounting.metric_counts``) and Lightning's epoch."""
TOP_PREFIXES = ("params.", "latency_ms", "lr-")
"""Families without a namespace: parameter counts, latencies, the learning rate (Lightning's monitor)."""


def check_name(name: str) -> None:
    """Raise ValueError for a metric name outside the registry: a name without ``/`` must be one of
    :data:`TOP_LEVEL` or start with one of :data:`TOP_PREFIXES`; a name with one is in one of
    :data:`NAMESPACES` or a fine-tuning task's (``<task>/...``, the task named by its config)."""
    namespace, slash, rest = name.partition("/")
    if slash and namespace and rest:
        return
    if not slash and (name in TOP_LEVEL or name.startswith(TOP_PREFIXES)):
        return
    raise ValueError(f"metric {name!r} is not in ablate's registry (ablate.lightning_modules.config.metric_names)")
