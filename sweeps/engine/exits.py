"""FastBERT's evaluation in a fine-tuning run, logged: the run's dev set as rows of one and its dev
metric, handed to the measuring layer (:mod:`ablate.lightning_modules.measure.exit_curve`, which
measures early exit at every ``finetune.exit_speeds`` threshold, or at ``finetune.exit_at``), and
what it measured logged to the run: the metrics, and the artifacts ``fastbert/curve.csv`` and
``fastbert/curve.png`` (the speed-accuracy curve).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ablate.datamodules.classification import ClassificationDataModule, collate
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.measure import exit_curve as curve
from ablate.lightning_modules.measure.exit_speed import Metric
from ablate.lightning_modules.methods.finetune import METRICS
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.early_exit import Batch
from ablate.sweeps.engine.context import ActiveRun


def _metric(name: str, num_labels: int) -> Metric:
    """A dev metric of predicted classes against labels: the fine-tuning module's own (``METRICS``)."""
    return lambda p, y: float(METRICS[name](num_labels)(p, y))


def dev_rows(data: ClassificationDataModule) -> tuple[list[Batch], torch.Tensor]:
    """The dev set as batches of one (unpadded) and its labels (N,)."""
    val = data.val_set
    assert val is not None
    rows = [collate([val[i]]) for i in range(len(val))]
    return rows, torch.cat([r.pop("labels") for r in rows])


def used_at(model: Classifier, cfg: ExperimentConfig, data: ClassificationDataModule) -> dict[str, float]:
    """How the fine-tuned classifier is used (:func:`ablate.lightning_modules.measure.exit_curve.used_at`):
    its batch-1 latency on the dev set and, when ``finetune.exit_at`` sets a speed, early exit's metric
    and mean layers there."""
    f = cfg.finetune
    rows, labels = dev_rows(data)
    return curve.used_at(model, rows, labels, f.task, (f.metric, _metric(f.metric, f.num_labels)), f.exit_at)


def exit_curve(
    model: Classifier, cfg: ExperimentConfig, data: ClassificationDataModule, run: ActiveRun, step: int
) -> dict[str, float]:
    """Early exit at each ``finetune.exit_speeds`` on the dev set, on the CPU
    (:func:`ablate.lightning_modules.measure.exit_curve.exit_curve`); logged at ``step`` with the
    curve's CSV and plot, and returned as metrics."""
    f = cfg.finetune
    rows, labels = dev_rows(data)
    measured = curve.exit_curve(model, rows, labels, f.exit_speeds, _metric(f.metric, f.num_labels))
    metrics = measured.metrics(f.task, f.metric)
    with tempfile.TemporaryDirectory(prefix="ablate-fastbert-") as tmp:
        folder = Path(tmp)
        (folder / "curve.csv").write_text(measured.csv(f.metric), encoding="utf-8")
        measured.plot(f.metric, folder / "curve.png")
        run.client.log_artifacts(run.run_id, str(folder), "fastbert")
    run.log(metrics, step=step)
    return metrics
