"""FastBERT's evaluation on a dev set: early exit at every speed threshold, timed at batch 1 on the CPU
with real early exit (:func:`exit_curve`), or at the one speed a classifier is used at
(:func:`used_at`); the ``<task>/speed_<s>/...`` metrics a run logs from them, the curve as CSV and
its plot (docs/guides/fastbert.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.lightning_modules.measure.exit_speed import (
    Metric,
    SpeedPoint,
    full_latency_ms,
    shape_latency_ms,
    speed_curve,
)
from ablate.lightning_modules.measure.measuring import placed
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.early_exit import Batch

TIMED = 200
"""Dev examples whose batch-1 latency is measured at each speed (the metric uses all of them)."""


def speed_key(task: str, speed: float, what: str) -> str:
    """``<task>/speed_<s>/<what>``: one metric of early exit at one speed."""
    return f"{task}/speed_{speed:g}/{what}"


@dataclass(frozen=True)
class ExitCurve:
    """Early exit at each speed on a dev set (:func:`exit_curve`) and the full model timed the same way."""

    points: tuple[SpeedPoint, ...]
    full_ms: float

    def metrics(self, task: str, metric: str) -> dict[str, float]:
        """The run's metrics: ``<task>/full_latency_ms`` and, per speed, the metric, layers, FLOPs and latency."""
        out = {f"{task}/full_latency_ms": self.full_ms}
        for p in self.points:
            out[speed_key(task, p.speed, metric)] = p.metric_value
            out[speed_key(task, p.speed, "layers")] = p.mean_layers
            out[speed_key(task, p.speed, "flops")] = p.flops_per_example
            out[speed_key(task, p.speed, "latency_ms")] = p.latency_ms
        return out

    def csv(self, metric: str) -> str:
        """``speed,<metric>,mean_layers,flops_per_example,latency_ms``, one row per speed."""
        lines = [f"speed,{metric},mean_layers,flops_per_example,latency_ms"]
        lines += [
            f"{p.speed:g},{p.metric_value:.6f},{p.mean_layers:.4f},{p.flops_per_example:.0f},{p.latency_ms:.4f}"
            for p in self.points
        ]
        return "\n".join(lines) + "\n"

    def plot(self, metric: str, path: Path) -> None:
        """The speed-accuracy curve as a PNG: the dev metric against mean layers run and against batch-1
        latency (the full model's as a dashed line), each point named by its speed."""
        from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on save

        fig = Figure(figsize=(9, 3.5))
        axes = fig.subplots(1, 2)
        values = [100 * p.metric_value for p in self.points]
        layers, latency = [p.mean_layers for p in self.points], [p.latency_ms for p in self.points]
        for ax, x, label in ((axes[0], layers, "mean layers run"), (axes[1], latency, "batch-1 ms")):
            ax.plot(x, values, marker="o")
            for p, xi, yi in zip(self.points, x, values, strict=True):
                ax.annotate(f"{p.speed:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
            ax.set_xlabel(label)
            ax.set_ylabel(f"dev {metric} (%)")
            ax.grid(alpha=0.3)
        axes[1].axvline(self.full_ms, color="grey", linestyle="--", label="full model")
        axes[1].legend(loc="lower right", fontsize=8)
        fig.suptitle("FastBERT: early exit by speed threshold")
        fig.tight_layout()
        fig.savefig(path, dpi=120)


def exit_curve(
    model: Classifier, rows: Sequence[Batch], labels: torch.Tensor, speeds: Sequence[float], metric: Metric
) -> ExitCurve:
    """Early exit at each of ``speeds`` on the dev ``rows`` (batches of one, unpadded) and their
    ``labels`` (N,), on the CPU, the first :data:`TIMED` rows timed; and the full model timed alike."""
    with placed(model, torch.device("cpu"), train=False):
        points = speed_curve(model, list(rows), labels, speeds, metric=metric, timed=TIMED)
        full_ms = full_latency_ms(model, rows[:TIMED])
    return ExitCurve(tuple(points), full_ms)


def used_at(
    model: Classifier,
    rows: Sequence[Batch],
    labels: torch.Tensor,
    task: str,
    metric: tuple[str, Metric],
    speed: float | None,
) -> dict[str, float]:
    """How a fine-tuned classifier is used, measured on the dev ``rows`` on the CPU: its batch-1 latency
    (``<task>/latency_ms``, the mean over the first :data:`TIMED` rows of each one's fastest of 3 runs)
    and, at an early-exit ``speed``, early exit's metric (``metric``: its name and function) and
    mean layers there (``<task>/final_<metric>``, ``<task>/exit_layers``)."""
    name, score = metric
    with placed(model, torch.device("cpu"), train=False):
        if speed is None:
            return {f"{task}/latency_ms": shape_latency_ms(model, rows[:TIMED])}
        (point,) = speed_curve(model, list(rows), labels, [speed], metric=score, timed=TIMED)
    return {
        f"{task}/latency_ms": point.latency_ms,
        f"{task}/final_{name}": point.metric_value,
        f"{task}/exit_layers": point.mean_layers,
    }
