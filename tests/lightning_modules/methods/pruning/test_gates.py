"""schuBERT gates: only the chosen dimensions, ones change nothing, detach restores the model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ObjectiveConfig
from ablate.lightning_modules.config.model import LayerSpec, ModelConfig
from ablate.lightning_modules.methods.pruning.gates import Gates, attach, attached, detach, masked_layer_norm
from ablate.lightning_modules.methods.pruning.keep import DIMS, VARIANTS
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model

BASE = ModelConfig(
    vocab_size=100, embed_dim=24, hidden_dim=24, num_layers=2, num_heads=3, ffn_dim=40, max_position=32, dropout=0.0
)
# name -> (model overrides, sentence objective): E = H and E != H, both norms, with and without extras
CASES: dict[str, tuple[dict[str, object], str]] = {
    "tied": ({}, "sop"),
    "tied_bare": (
        {
            "embed_norm": False,
            "position": "none",
            "token_types": 0,
            "activation": "relu",
            "num_ffn": 2,
            "layers": (
                LayerSpec(num_heads=3, qk_dim=8, v_dim=6, ffn_dim=40),
                LayerSpec(num_heads=2, qk_dim=5, v_dim=7, ffn_dim=30),
            ),
        },
        "none",
    ),
    "tied_nonorm": ({"norm": "no_norm"}, "nsp"),
    "factorized": ({"embed_dim": 16}, "sop"),
    "factorized_nonorm": ({"embed_dim": 16, "norm": "no_norm", "embed_norm": False}, "sop"),
}


def _case(name: str, seed: int = 0) -> tuple[ModelConfig, ObjectiveConfig, PretrainingModel]:
    """A small model in eval mode with random, non-trivial weights (norms and biases too)."""
    overrides, sentence = CASES[name]
    cfg = dataclasses.replace(BASE, **overrides)
    objective = ObjectiveConfig(sentence=sentence)
    model = build_pretraining_model(cfg, objective).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():  # matrices ~ 1/sqrt(fan in): activations stay O(1) without norms
            scale = 1.0 / p.shape[1] ** 0.5 if p.dim() == 2 else 0.2
            p.copy_(torch.randn(p.shape, generator=g) * scale + (1.0 if key.endswith("norm.weight") else 0.0))
    return cfg, objective, model


def _batch(cfg: ModelConfig, seed: int = 0, B: int = 3, T: int = 12) -> dict[str, torch.Tensor]:
    """Token ids with padding at the end of two rows, a few masked positions."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, T - 3, 5])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    ids = torch.randint(1, cfg.vocab_size, (B, T), generator=g).masked_fill(~mask, 0)
    labels = torch.full((B, T), -100)
    labels[:, 1:5:2] = ids[:, 1:5:2]
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "mlm_labels": labels,
        "sentence_label": torch.randint(0, 2, (B,), generator=g),
    }
    if cfg.token_types:
        batch["token_type_ids"] = (torch.arange(T)[None, :] >= 4).long().expand(B, T) * mask
    return batch


@torch.no_grad()
def _outputs(model: PretrainingModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Encoder states at real tokens (N, H), MLM logits, sentence logits (when a head exists)."""
    hidden = model.encoder(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
    out = model(batch)
    outputs = {"hidden": hidden[batch["attention_mask"]], "mlm": out.mlm_logits}
    if out.sentence_logits is not None:
        outputs["sentence"] = out.sentence_logits
    return outputs


def _random_gates(cfg: ModelConfig, dims: tuple[str, ...], seed: int = 0) -> Gates:
    """Gates with values in (0, 2), about a third zero, at least one zero per vector."""
    gates = Gates(cfg, dims)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for vectors in gates.vectors().values():
            for v in vectors:
                v.copy_(torch.rand(v.shape, generator=g) * 2 * (torch.rand(v.shape, generator=g) > 0.35))
                v[torch.randint(0, len(v), (1,), generator=g)] = 0.0
    return gates


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_only_the_chosen_dimensions_get_gates(variant):
    cfg = _case("tied_bare")[0]
    gates = Gates(cfg, VARIANTS[variant])
    specs = cfg.layer_specs()
    sizes = {
        "h": [cfg.hidden_dim],
        "heads": [s.num_heads for s in specs],
        "qk": [s.qk_dim for s in specs],
        "v": [s.v_dim for s in specs],
        "ffn": [s.ffn_dim for s in specs],
    }
    expected = {(f"{d}.{i}" if d != "h" else "h"): n for d in VARIANTS[variant] for i, n in enumerate(sizes[d])}
    assert {k: p.numel() for k, p in gates.named_parameters()} == expected
    assert all(bool((p == 1).all()) for p in gates.parameters())
    assert set(gates.vectors()) == set(VARIANTS[variant])


def test_ffn_gates_touch_only_the_up_projections():
    cfg, _, model = _case("tied")
    attach(model, Gates(cfg, VARIANTS["schubert-f"]))
    gated = {name for name, m in model.named_modules() if parametrize.is_parametrized(m)}
    assert gated == {f"encoder.ffn_stacks.{i}.0.inner.up" for i in range(2)}
    assert not any(m._forward_hooks for m in model.modules())
    detach(model)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gates_at_one_change_nothing_and_detach_restores(case):
    cfg, _, model = _case(case)
    batch = _batch(cfg)
    before = _outputs(model, batch)
    params = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    classes = {name: type(m) for name, m in model.named_modules()}
    gates = Gates(cfg, DIMS)
    attach(model, gates)
    assert attached(model) and any(parametrize.is_parametrized(m) for m in model.modules())
    for key, value in _outputs(model, batch).items():
        torch.testing.assert_close(value, before[key], atol=1e-5, rtol=1e-5)
    detach(model)
    assert not attached(model)
    assert not any(parametrize.is_parametrized(m) or m._forward_hooks for m in model.modules())
    assert {name: type(m) for name, m in model.named_modules()} == classes
    assert all(p is params[k] for k, p in model.named_parameters()) and len(params) == len(list(model.parameters()))
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    for key, value in _outputs(model, batch).items():
        assert torch.equal(value, before[key])


def test_gates_receive_gradients_and_l1():
    cfg, _, model = _case("tied")
    gates = _random_gates(cfg, DIMS)
    attach(model, gates)
    model(_batch(cfg)).loss.backward()
    detach(model)
    for dim, vectors in gates.vectors().items():
        assert all(v.grad is not None and bool(v.grad.abs().sum() > 0) for v in vectors), dim
        torch.testing.assert_close(gates.l1(dim), sum(v.abs().sum() for v in vectors))


def test_attach_twice_is_refused():
    cfg, _, model = _case("tied")
    attach(model, Gates(cfg, DIMS))
    with pytest.raises(ValueError, match="already"):
        attach(model, Gates(cfg, DIMS))
    detach(model)


def test_masked_layer_norm_is_layer_norm_over_the_kept_dims():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 5, 10, generator=g), torch.randn(10, generator=g), torch.randn(10, generator=g)
    keep = torch.tensor([1, 0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    y = masked_layer_norm(x, keep, w * keep, b * keep, 1e-12)
    ref = nn.functional.layer_norm(x[..., keep], (int(keep.sum()),), w[keep], b[keep], 1e-12)
    torch.testing.assert_close(y[..., keep], ref, atol=1e-6, rtol=1e-5)
    assert bool((y[..., ~keep] == 0).all())


@pytest.mark.parametrize(
    ("field", "value"),
    [("sharing", "all"), ("sharing", "attn"), ("intra_dim", 12), ("embedding", "trigram"), ("mlm_head", "mobilebert")],
)
def test_unsupported_encoders_raise_naming_the_field(field, value):
    cfg = dataclasses.replace(BASE, **{field: value})
    with pytest.raises(ConfigError, match=rf"^model\.{field}: schuBERT pruning needs"):
        Gates(cfg, DIMS)


def test_unknown_dimension_is_refused():
    with pytest.raises(ConfigError, match="unknown dimensions"):
        Gates(BASE, ("ffn", "intra"))
