"""Surgery: the shrunk model computes what the gated model computes; its config counts and reloads."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.measure.accounting import count, param_report, report_for
from ablate.lightning_modules.methods.pruning.gates import Gates, attach, detach
from ablate.lightning_modules.methods.pruning.keep import DIMS, VARIANTS, Keep
from ablate.lightning_modules.methods.pruning.surgery import keep_from_gates, shrink
from ablate.lightning_modules.model.heads import build_pretraining_model
from tests.lightning_modules.methods.pruning.test_gates import BASE, CASES, _batch, _case, _outputs, _random_gates


def _gated_outputs(model, gates, batch):
    attach(model, gates)
    try:
        return _outputs(model, batch)
    finally:
        detach(model)


def _assert_same(gated, shrunk, keep_h):
    """Gated and shrunk outputs agree; the gated residual stream is zero at removed h dims."""
    removed = torch.ones(gated["hidden"].shape[-1], dtype=torch.bool)
    removed[keep_h] = False
    assert bool((gated["hidden"][:, removed] == 0).all())
    torch.testing.assert_close(shrunk["hidden"], gated["hidden"][:, keep_h], atol=1e-5, rtol=1e-5)
    assert gated.keys() == shrunk.keys()
    for key in gated.keys() - {"hidden"}:
        torch.testing.assert_close(shrunk[key], gated[key], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_shrunk_model_computes_what_the_gated_model_computes(case, variant):
    cfg, _, model = _case(case)
    gates = _random_gates(cfg, VARIANTS[variant])
    batch = _batch(cfg)
    keep = keep_from_gates(gates, cfg)
    new_cfg, shrunk = shrink(model, cfg, keep, gates)
    assert not shrunk.training
    _assert_same(_gated_outputs(model, gates, batch), _outputs(shrunk, batch), keep.h)
    pruned = {
        "h": len(keep.h) < cfg.hidden_dim,
        **{
            d: any(
                len(k) < len(everything)
                for k, everything in zip(getattr(keep, d), getattr(Keep.everything(cfg), d), strict=False)
            )
            for d in ("heads", "qk", "v", "ffn")
        },
    }
    assert {d for d, p in pruned.items() if p} == set(VARIANTS[variant])  # every gated dimension shrank


def test_all_zero_gates_of_a_layer_keep_one_inert_unit():
    cfg, _, model = _case("tied")
    gates = _random_gates(cfg, DIMS, seed=1)
    with torch.no_grad():
        gates.heads[0].zero_()
        gates.qk[1].zero_()
        gates.v[1].zero_()
        gates.ffn[1].zero_()
    keep = keep_from_gates(gates, cfg)
    assert [len(k) for k in (keep.heads[0], keep.qk[1], keep.v[1], keep.ffn[1])] == [1, 1, 1, 1]
    _, shrunk = shrink(model, cfg, keep, gates)
    batch = _batch(cfg)
    _assert_same(_gated_outputs(model, gates, batch), _outputs(shrunk, batch), keep.h)


@pytest.mark.parametrize("case", ["tied", "factorized"])
def test_shrink_without_gates_is_the_model_gated_with_zeros_and_ones(case):
    cfg, _, model = _case(case)
    keep = keep_from_gates(_random_gates(cfg, DIMS, seed=2), cfg)
    gates = Gates(cfg, DIMS)
    gates.zero_except(keep)
    batch = _batch(cfg)
    _, shrunk = shrink(model, cfg, keep)
    _assert_same(_gated_outputs(model, gates, batch), _outputs(shrunk, batch), keep.h)


def test_keep_from_gates():
    cfg = BASE
    gates = Gates(cfg, ("h", "ffn"))
    with torch.no_grad():
        gates.h[[0, 5, 7]] = 0.0
        gates.ffn[1][3] = 0.0
    keep = keep_from_gates(gates, cfg)
    assert keep.h.tolist() == [i for i in range(24) if i not in (0, 5, 7)]
    assert keep.ffn[0].tolist() == list(range(40)) and keep.ffn[1].tolist() == [i for i in range(40) if i != 3]
    assert [k.tolist() for k in keep.heads] == [[0, 1, 2]] * 2 and [len(k) for k in keep.qk + keep.v] == [8] * 4
    with torch.no_grad():
        gates.h.zero_()
    with pytest.raises(ConfigError, match="^gates.h: every h gate is zero"):
        keep_from_gates(gates, cfg)


def _backbone(cfg):
    """Backbone parameters by hand: embeddings (+ E -> H) and per-layer attention, FFN and norms."""
    E, H = cfg.embed_dim, cfg.hidden_dim
    n = cfg.vocab_size * E + cfg.max_position * E + cfg.token_types * E + 2 * E + (E * H + H if E != H else 0)
    for s in cfg.layer_specs():
        qkv = s.num_heads * (2 * s.qk_dim + s.v_dim)
        n += H * qkv + qkv + s.num_heads * s.v_dim * H + H + 2 * H
        n += cfg.num_ffn * (H * s.ffn_dim + s.ffn_dim + s.ffn_dim * H + H + 2 * H)
    return n


@pytest.mark.parametrize("case", ["tied", "factorized"])
def test_shrunk_config_counts_the_new_model_and_loads_its_weights(case):
    cfg, objective, model = _case(case)
    gates = _random_gates(cfg, DIMS, seed=3)
    keep = keep_from_gates(gates, cfg)
    new_cfg, shrunk = shrink(model, cfg, keep, gates)
    assert new_cfg == keep.config(cfg) and new_cfg.hidden_dim == len(keep.h)
    assert new_cfg.embed_dim == (len(keep.h) if cfg.embed_dim == cfg.hidden_dim else cfg.embed_dim)
    assert [s.num_heads for s in new_cfg.layers] == [len(k) for k in keep.heads]
    assert [s.ffn_dim for s in new_cfg.layers] == [len(k) for k in keep.ffn]
    report = report_for(new_cfg, objective, seq_len=16)
    assert report == param_report(shrunk, new_cfg, seq_len=16)
    assert report.backbone == count(shrunk.encoder) == _backbone(new_cfg) < _backbone(cfg)
    fresh = build_pretraining_model(new_cfg, objective)  # what `ablate train` builds from the config
    fresh.load_state_dict(shrunk.state_dict())
    for p in shrunk.parameters():
        assert isinstance(p, nn.Parameter) and p.requires_grad and p.device.type == "cpu"


def test_input_model_is_left_untouched():
    cfg, _, model = _case("tied")
    gates = _random_gates(cfg, DIMS, seed=4)
    params = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    _, shrunk = shrink(model, cfg, keep_from_gates(gates, cfg), gates)
    with torch.no_grad():
        for p in shrunk.parameters():
            p.add_(1.0)  # the copies share no storage with the input
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[k] for k, p in model.named_parameters())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_sentence_head_follows_the_input_model():
    cfg, _, model = _case("tied_bare")
    _, shrunk = shrink(model, cfg, Keep.everything(cfg))
    assert shrunk.sentence_head is None
    batch = _batch(cfg)
    for key, value in _outputs(shrunk, batch).items():
        torch.testing.assert_close(value, _outputs(model, batch)[key], atol=1e-6, rtol=1e-6)


def test_shrink_refuses_attached_models_and_unsupported_encoders():
    cfg, _, model = _case("tied")
    attach(model, Gates(cfg, DIMS))
    with pytest.raises(ValueError, match="detach"):
        shrink(model, cfg, Keep.everything(cfg))
    detach(model)
    shared = dataclasses.replace(BASE, sharing="all")
    with pytest.raises(ConfigError, match=r"^model\.sharing:"):
        shrink(build_pretraining_model(shared, _case("tied")[1]), shared, Keep.everything(shared))


def test_keeping_exactly_e_hidden_dims_is_refused_when_e_differs_from_h():
    cfg, _, model = _case("factorized")  # E = 16, H = 24
    keep = dataclasses.replace(Keep.everything(cfg), h=torch.arange(16))
    with pytest.raises(ConfigError, match=r"^model\.embed_dim: keeping 16 h dims = E"):
        shrink(model, cfg, keep)
    new_cfg, shrunk = shrink(model, cfg, dataclasses.replace(keep, h=torch.arange(15)))
    assert (new_cfg.embed_dim, new_cfg.hidden_dim) == (16, 15) and shrunk.encoder.embeddings.projection is not None
