"""FastBERT's evaluation on a dev set (the measuring layer's side of a run's exit curve): the metrics a
run logs, the CSV and the plot, and the one speed a classifier is used at."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ablate.lightning_modules.measure.exit_curve import exit_curve, speed_key, used_at
from tests.lightning_modules.model.test_early_exit import C, _examples, _model


def _accuracy(preds: torch.Tensor, labels: torch.Tensor) -> float:
    return float((preds == labels).float().mean())


def test_the_curve_gives_a_runs_metrics_csv_and_plot(tmp_path: Path) -> None:
    model, rows = _model("bert-tiny"), _examples(6)
    labels = torch.arange(len(rows)) % C
    curve = exit_curve(model, rows, labels, [0.0, 1.0], _accuracy)
    L = len(model.encoder.plan)
    metrics = curve.metrics("sst2", "accuracy")
    assert metrics[speed_key("sst2", 0.0, "layers")] == L and metrics[speed_key("sst2", 1.0, "layers")] == 1
    assert metrics["sst2/full_latency_ms"] == curve.full_ms > 0
    assert len(metrics) == 1 + 4 * 2
    with torch.no_grad():
        full = torch.cat([model(r) for r in rows]).argmax(-1)
    assert metrics["sst2/speed_0/accuracy"] == pytest.approx(_accuracy(full, labels))
    lines = curve.csv("accuracy").splitlines()
    assert lines[0] == "speed,accuracy,mean_layers,flops_per_example,latency_ms"
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1"]
    curve.plot("accuracy", tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_used_at_is_the_latency_alone_without_a_speed_and_early_exit_with_one() -> None:
    model, rows = _model("bert-tiny"), _examples(4)
    labels = torch.arange(len(rows)) % C
    plain = used_at(model, rows, labels, "rte", ("accuracy", _accuracy), None)
    assert list(plain) == ["rte/latency_ms"] and plain["rte/latency_ms"] > 0
    exited = used_at(model, rows, labels, "rte", ("accuracy", _accuracy), 1.0)
    assert exited["rte/exit_layers"] == 1 and 0 <= exited["rte/final_accuracy"] <= 1
