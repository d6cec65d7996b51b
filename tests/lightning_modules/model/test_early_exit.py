"""FastBERT's early exit on real tiny models: a plain BERT, a bottleneck MobileBERT, a shared ALBERT."""

from __future__ import annotations

import functools

import pytest
import torch

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.model.classifier import Classifier, build_classifier, hidden_width
from ablate.lightning_modules.model.early_exit import (
    build_exits,
    exit_logits,
    normalized_entropy,
    predict_early_exit,
    self_distillation_loss,
)
from ablate.lightning_modules.model.heads import build_pretraining_model

PRESETS = ["bert-tiny", "mobilebert-mini", "albert-tiny"]
C = 3


@functools.cache
def _model(preset: str) -> Classifier:
    torch.manual_seed(0)
    cfg = build_config({"model": {"preset": preset}})
    model = build_classifier(build_pretraining_model(cfg.model, cfg.objective), C, 0.1, 0.02)
    model.exits = build_exits(hidden_width(model.encoder), cfg.model.num_layers, C, 0.1, 0.05)
    return model.eval()


def _examples(n: int = 8, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Unpadded batches of one, of varied lengths; one without token types or mask, one padded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = int(torch.randint(3, 20, (1,), generator=g))
        ex = {
            "input_ids": torch.randint(5, 8192, (1, T), generator=g),
            "token_type_ids": (torch.arange(T) >= T // 2).long()[None],
            "attention_mask": torch.ones(1, T, dtype=torch.bool),
        }
        if i == 0:
            ex = {"input_ids": ex["input_ids"]}
        if i == 1:  # padded: the last 2 positions masked out
            ex["input_ids"][0, -2:] = 0
            ex["attention_mask"][0, -2:] = False
        out.append(ex)
    return out


def _entropies(model: Classifier, ex: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], list[float]]:
    with torch.no_grad():
        logits = exit_logits(model, ex)
    return logits, [normalized_entropy(z).item() for z in logits]


@pytest.mark.parametrize("preset", PRESETS)
def test_speed_zero_runs_every_layer_and_gives_the_final_logits(preset: str) -> None:
    model = _model(preset)
    L = len(model.encoder.plan)
    for ex in _examples():
        with torch.no_grad():
            full = model(ex)
        logits, layers = predict_early_exit(model, ex, 0.0)
        assert layers == L
        assert torch.equal(logits, full)
        assert torch.equal(_entropies(model, ex)[0][-1], full)  # exit_logits' last is the final head


@pytest.mark.parametrize("preset", PRESETS)
def test_speed_one_leaves_after_the_first_layer(preset: str) -> None:
    model = _model(preset)
    for ex in _examples():
        logits, layers = predict_early_exit(model, ex, 1.0)
        assert layers == 1
        assert torch.equal(logits, _entropies(model, ex)[0][0])


@pytest.mark.parametrize("preset", PRESETS)
def test_an_example_leaves_at_the_first_exit_under_the_threshold(preset: str) -> None:
    model = _model(preset)
    L = len(model.encoder.plan)
    examples = _examples()
    per_example = [_entropies(model, ex) for ex in examples]
    values = sorted({h for _, hs in per_example for h in hs[:-1]})
    speeds = [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]  # between entropies: no ties
    assert len(speeds) >= 10
    seen = set()
    for speed in speeds:
        for ex, (logits, hs) in zip(examples, per_example, strict=True):
            expected = next((i + 1 for i, h in enumerate(hs[:-1]) if h < speed), L)
            got, layers = predict_early_exit(model, ex, speed)
            assert layers == expected
            assert torch.allclose(got, logits[layers - 1], rtol=0, atol=1e-6)
            seen.add(layers)
    assert len(seen) >= 2  # the thresholds did move the exits


def test_early_exit_refuses_batches_and_needs_exits() -> None:
    model = _model("bert-tiny")
    two = {"input_ids": torch.randint(5, 100, (2, 5))}
    with pytest.raises(ValueError, match="batch of 1"):
        predict_early_exit(model, two, 0.5)
    bare = Classifier(model.encoder, model.head).eval()
    one = _examples(1)[0]
    assert predict_early_exit(bare, one, 0.0)[1] == len(model.encoder.plan)  # speed 0 needs no exits
    with pytest.raises(ValueError, match="exits"):
        predict_early_exit(bare, one, 0.5)


def test_build_exits_makes_fresh_heads() -> None:
    exits = build_exits(16, 5, 4, 0.1, 0.02)
    assert len(exits) == 4
    assert len({id(e.pooler) for e in exits}) == 4
    out = exits[0](torch.randn(7, 16))
    assert out.shape == (7, 4)


def test_normalized_entropy() -> None:
    logits = torch.randn(64, 5) * torch.logspace(-2, 2, 64)[:, None]
    h = normalized_entropy(logits)
    assert h.shape == (64,)
    assert bool((h >= 0).all()) and bool((h <= 1).all())
    assert torch.allclose(normalized_entropy(torch.zeros(3, 7)), torch.ones(3))
    assert normalized_entropy(torch.tensor([[50.0, -50.0]])).item() < 1e-6


def test_self_distillation_loss_is_zero_only_when_the_exits_match() -> None:
    teacher = torch.randn(4, C)
    assert self_distillation_loss([teacher.clone(), teacher.clone()], teacher).item() == pytest.approx(0.0, abs=1e-7)
    students = [teacher.clone(), torch.randn(4, C)]
    one = self_distillation_loss(students[1:], teacher)
    assert one.item() > 0
    assert self_distillation_loss(students, teacher).item() == pytest.approx(one.item(), rel=1e-6)  # a sum
    both = self_distillation_loss([students[1], students[1]], teacher)
    assert both.item() == pytest.approx(2 * one.item(), rel=1e-6)


def test_self_distillation_gradient_reaches_only_the_exits() -> None:
    torch.manual_seed(0)
    cfg = build_config({"model": {"preset": "bert-tiny"}})
    model = build_classifier(build_pretraining_model(cfg.model, cfg.objective), C, 0.0, 0.02)
    model.exits = build_exits(hidden_width(model.encoder), cfg.model.num_layers, C, 0.0, 0.05)
    for p in [*model.encoder.parameters(), *model.head.parameters()]:
        p.requires_grad_(False)
    batch = {"input_ids": torch.randint(5, 8192, (4, 9)), "attention_mask": torch.ones(4, 9, dtype=torch.bool)}
    logits = exit_logits(model, batch)
    loss = self_distillation_loss(logits[:-1], logits[-1])
    assert loss.item() > 0
    loss.backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.exits.parameters())
    assert all(p.grad is None for p in [*model.encoder.parameters(), *model.head.parameters()])


def test_row_entropy_is_normalized_entropy_on_the_host() -> None:
    from ablate.lightning_modules.model.early_exit import row_entropy

    torch.manual_seed(0)
    for logits in (torch.randn(1, 2), 5 * torch.randn(1, 3), torch.zeros(1, 4), torch.tensor([[30.0, -30.0]])):
        assert row_entropy(logits) == pytest.approx(float(normalized_entropy(logits)), abs=1e-6)
