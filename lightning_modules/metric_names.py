"""The names of the validation metrics runs log, written once: the modules log them under
these names, and a study's objective is checked against them before it runs.

A pre-training, distillation, pruning or quantization run validates its MLM (and its sentence
task when it has one); a fine-tuning task ``T`` logs ``T/<metric>`` per validation and
``T/best_<metric>``, ``T/final_<metric>`` at the end; a chained trial adds ``downstream/avg``.
"""

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
TASK_STAGES = ("", "best_", "final_")
"""``<task>/<stage><metric>``: each validation's, the best one's, the shipped classifier's."""


def task_metrics(task: str, metric: str) -> tuple[str, ...]:
    """The names a fine-tuning task's run returns for its ``finetune.metric``."""
    return tuple(f"{task}/{stage}{metric}" for stage in TASK_STAGES)
