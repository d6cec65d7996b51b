"""FastBERT's evaluation in a fine-tuning run: early exit on the dev set at every
``finetune.exit_speeds`` threshold, timed at batch 1 on the CPU with real early exit.

For each speed s the run logs ``<task>/speed_<s>/<metric>`` (the task metric of the early-exit
predictions), ``.../layers`` (mean layers run), ``.../flops`` (forward FLOPs per example that
implies) and ``.../latency_ms`` (measured batch-1 latency), the full model's forward
``<task>/full_latency_ms``, and the artifacts ``fastbert/curve.csv``
and ``fastbert/curve.png`` (the speed-accuracy curve).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ablate.datamodules.classification import ClassificationDataModule, collate
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.measure.exit_speed import Metric, SpeedPoint, full_latency_ms, speed_curve
from ablate.lightning_modules.measure.measuring import placed
from ablate.lightning_modules.methods.finetune import METRICS
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.early_exit import Batch
from ablate.sweeps.engine.context import ActiveRun

TIMED = 200
"""Dev examples whose batch-1 latency is measured at each speed (the metric uses all of them)."""


def speed_key(task: str, speed: float, what: str) -> str:
    """``<task>/speed_<s>/<what>``: one metric of early exit at one speed."""
    return f"{task}/speed_{speed:g}/{what}"


def _metric(name: str, num_labels: int) -> Metric:
    """A dev metric of predicted classes against labels: the fine-tuning module's own (``METRICS``)."""
    return lambda p, y: float(METRICS[name](num_labels)(p, y))


def _plot(points: list[SpeedPoint], full_ms: float, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    layers = [p.mean_layers for p in points]
    values = [100 * p.metric_value for p in points]
    for ax, x, label in ((axes[0], layers, "mean layers run"), (axes[1], [p.latency_ms for p in points], "batch-1 ms")):
        ax.plot(x, values, marker="o")
        for p, xi, yi in zip(points, x, values, strict=True):
            ax.annotate(f"{p.speed:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel(label)
        ax.set_ylabel(f"dev {metric} (%)")
        ax.grid(alpha=0.3)
    axes[1].axvline(full_ms, color="grey", linestyle="--", label="full model")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle("FastBERT: early exit by speed threshold")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dev_rows(data: ClassificationDataModule) -> tuple[list[Batch], torch.Tensor]:
    """The dev set as batches of one (unpadded) and its labels (N,)."""
    val = data.val_set
    assert val is not None
    rows = [collate([val[i]]) for i in range(len(val))]
    return rows, torch.cat([r.pop("labels") for r in rows])


def used_at(model: Classifier, cfg: ExperimentConfig, data: ClassificationDataModule) -> dict[str, float]:
    """How the fine-tuned classifier is used, measured on the dev set on the CPU: its batch-1 latency
    (``<task>/latency_ms``, the mean over the first :data:`TIMED` dev sentences of each one's fastest of
    3 runs) and, when ``finetune.exit_at`` sets a speed, early exit's metric and mean layers there
    (``<task>/final_<metric>``, ``<task>/exit_layers``)."""
    f = cfg.finetune
    rows, labels = dev_rows(data)
    with placed(model, torch.device("cpu"), train=False):
        if f.exit_at is None:
            return {f"{f.task}/latency_ms": full_latency_ms(model, rows[:TIMED])}
        metric = _metric(f.metric, f.num_labels)
        (point,) = speed_curve(model, rows, labels, [f.exit_at], metric=metric, timed=TIMED)
    return {
        f"{f.task}/latency_ms": point.latency_ms,
        f"{f.task}/final_{f.metric}": point.metric_value,
        f"{f.task}/exit_layers": point.mean_layers,
    }


def exit_curve(
    model: Classifier, cfg: ExperimentConfig, data: ClassificationDataModule, run: ActiveRun, step: int
) -> dict[str, float]:
    """Early exit at each ``finetune.exit_speeds`` on the dev set, on the CPU; logged, and returned
    as metrics."""
    f = cfg.finetune
    rows, labels = dev_rows(data)
    with placed(model, torch.device("cpu"), train=False):
        points = speed_curve(model, rows, labels, f.exit_speeds, metric=_metric(f.metric, f.num_labels), timed=TIMED)
        full_ms = full_latency_ms(model, rows[:TIMED])
    metrics: dict[str, float] = {f"{f.task}/full_latency_ms": full_ms}
    for p in points:
        metrics[speed_key(f.task, p.speed, f.metric)] = p.metric_value
        metrics[speed_key(f.task, p.speed, "layers")] = p.mean_layers
        metrics[speed_key(f.task, p.speed, "flops")] = p.flops_per_example
        metrics[speed_key(f.task, p.speed, "latency_ms")] = p.latency_ms
    with tempfile.TemporaryDirectory(prefix="ablate-fastbert-") as tmp:
        folder = Path(tmp)
        lines = [f"speed,{f.metric},mean_layers,flops_per_example,latency_ms"]
        lines += [
            f"{p.speed:g},{p.metric_value:.6f},{p.mean_layers:.4f},{p.flops_per_example:.0f},{p.latency_ms:.4f}"
            for p in points
        ]
        (folder / "curve.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        _plot(points, full_ms, f.metric, folder / "curve.png")
        run.client.log_artifacts(run.run_id, str(folder), "fastbert")
    run.log(metrics, step=step)
    return metrics
