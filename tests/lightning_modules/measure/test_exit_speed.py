"""FastBERT's early exit measured on real tiny models: the speed curve (metric, layers, FLOPs,
latency), where examples leave, and the latency ratio timed in turns."""

from __future__ import annotations

import pytest
import torch

from ablate.lightning_modules.measure.accounting import flops_per_token, linear_flops
from ablate.lightning_modules.measure.exit_speed import exit_counts, latency_ratio, speed_curve
from tests.lightning_modules.model.test_early_exit import PRESETS, C, _entropies, _examples, _model


@pytest.mark.parametrize("preset", PRESETS)
def test_speed_curve(preset: str) -> None:
    model = _model(preset)
    examples = _examples()
    labels = torch.arange(len(examples)) % C
    hs = sorted(h for ex in examples for h in _entropies(model, ex)[1][:-1])
    speeds = [0.0, hs[len(hs) // 4], hs[len(hs) // 2], hs[3 * len(hs) // 4], 1.0]
    points = speed_curve(model, examples, labels, speeds, timed=3, repeats=1, warmup=1)
    layers = [p.mean_layers for p in points]
    L = len(model.encoder.plan)
    assert layers[0] == L and layers[-1] == 1
    assert all(a >= b for a, b in zip(layers, layers[1:], strict=False))
    assert all(p.latency_ms > 0 and 0 <= p.metric_value <= 1 for p in points)
    full = [flops_per_token(model.encoder, ex["input_ids"].shape[1]) * ex["input_ids"].shape[1] for ex in examples]
    expected = sum(full) / len(full) + linear_flops(model.head)
    assert points[0].flops_per_example == pytest.approx(expected, rel=1e-12)
    flops = [p.flops_per_example for p in points]
    assert all(a >= b for a, b in zip(flops[1:], flops[2:], strict=False))
    with torch.no_grad():
        final = torch.cat([model(ex) for ex in examples]).argmax(-1)
    assert points[0].metric_value == pytest.approx((final == labels).float().mean().item())
    counts = exit_counts(model, examples, speeds[2])
    assert sum(counts) == len(examples) and len(counts) == L
    assert sum((i + 1) * n for i, n in enumerate(counts)) / len(examples) == pytest.approx(layers[2])


def test_latency_ratio_times_both_on_the_same_examples() -> None:
    model = _model("bert-tiny").train()
    try:
        r = latency_ratio(model, _examples(3), 1.0, repeats=1, warmup=1)
        assert model.training  # measured in eval mode, the mode restored
    finally:
        model.eval()
    assert r.speed == 1.0 and r.mean_layers == 1
    assert r.early_ms > 0 and r.full_ms > 0 and r.ratio == r.early_ms / r.full_ms


def test_batch_1_latency_is_timed_once_per_model_shape() -> None:
    """Two classifiers of one shape (other weights): the second takes the first's latency; another shape,
    or other examples, is timed anew."""
    from ablate.lightning_modules.measure import exit_speed

    examples = _examples(3)
    first = exit_speed.shape_latency_ms(_model("bert-tiny"), examples)
    timed = len(exit_speed._BY_SHAPE)
    other = _model("bert-tiny")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(2.0)
    assert exit_speed.shape_latency_ms(other, examples) == first and len(exit_speed._BY_SHAPE) == timed
    exit_speed.shape_latency_ms(other, examples[:2])
    exit_speed.shape_latency_ms(_model(PRESETS[-1]), examples)
    assert len(exit_speed._BY_SHAPE) == timed + 1 + (PRESETS[-1] != "bert-tiny")
