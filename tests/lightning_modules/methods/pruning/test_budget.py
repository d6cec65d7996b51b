"""schuBERT budgets: exact counts, unit costs, beta against the paper, the greedy round, baselines."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ObjectiveConfig
from ablate.lightning_modules.config.model import LayerSpec, ModelConfig
from ablate.lightning_modules.config.presets import get_preset
from ablate.lightning_modules.measure.accounting import count
from ablate.lightning_modules.methods.pruning.budget import (
    backbone_params,
    beta,
    choose,
    fewer_layers,
    magnitude_keep,
    uniform,
    unit_costs,
)
from ablate.lightning_modules.methods.pruning.keep import DIMS, LAYER_DIMS, VARIANTS, Keep
from ablate.lightning_modules.model.encoder import build_encoder
from ablate.lightning_modules.model.heads import build_pretraining_model

SMALL = ModelConfig(
    vocab_size=50, embed_dim=24, hidden_dim=24, num_layers=2, num_heads=4, ffn_dim=40, max_position=16, dropout=0.0
)
PER_LAYER = dataclasses.replace(
    SMALL,
    layers=(
        LayerSpec(num_heads=3, qk_dim=5, v_dim=7, ffn_dim=30),
        LayerSpec(num_heads=2, qk_dim=8, v_dim=4, ffn_dim=11),
    ),
)
SHAPES = {
    "uniform": SMALL,
    "per_layer": PER_LAYER,
    "e_ne_h": dataclasses.replace(PER_LAYER, embed_dim=10),
    "bare": dataclasses.replace(PER_LAYER, position="none", token_types=0, embed_norm=False),
    "no_norm": dataclasses.replace(PER_LAYER, norm="no_norm", embed_dim=10, num_ffn=2),
}


def built(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        return count(build_encoder(cfg))


def drop_one(cfg: ModelConfig, dim: str, layer: int) -> Keep:
    full = Keep.everything(cfg)
    if dim == "h":
        return dataclasses.replace(full, h=full.h[1:])
    per = list(getattr(full, dim))
    per[layer] = per[layer][1:]
    return dataclasses.replace(full, **{dim: tuple(per)})


@pytest.mark.parametrize("name", SHAPES)
def test_backbone_params_equals_the_built_model(name):
    assert backbone_params(SHAPES[name]) == built(SHAPES[name])


def test_backbone_params_of_bert_base():
    assert backbone_params(get_preset("bert-base")) == 108_490_752  # as accounting's report


def test_out_of_scope_is_refused():
    with pytest.raises(ConfigError, match="model.sharing"):
        backbone_params(get_preset("albert-tiny"))
    with pytest.raises(ConfigError, match="model.intra_dim"):
        backbone_params(get_preset("mobilebert-mini"))


@pytest.mark.parametrize("name", ["per_layer", "e_ne_h", "no_norm"])
def test_unit_costs_are_built_model_differences(name):
    cfg = SHAPES[name]
    costs, full = unit_costs(cfg), built(cfg)
    assert set(costs) == set(DIMS) and len(costs["h"]) == 1
    for dim in DIMS:
        for layer, cost in enumerate(costs[dim]):
            assert cost == full - built(drop_one(cfg, dim, layer).config(cfg)), (dim, layer)


def test_head_cost_by_hand():
    H, (a, k, v, _f) = 24, (3, 5, 7, 30)
    costs = unit_costs(PER_LAYER)
    assert costs["heads"][0] == (H + 1) * (2 * k + v) + v * H
    assert costs["qk"][0] == a * 2 * (H + 1) and costs["v"][0] == a * (H + 1 + H)
    assert costs["ffn"][0] == 2 * H + 1


def test_beta_of_bert_base_matches_the_paper():
    paper = {"heads": 1.0, "h": 0.73, "qk": 0.093, "v": 0.093, "ffn": 0.0078}
    got = beta(get_preset("bert-base"))
    for dim, value in paper.items():
        assert abs(got[dim] / value - 1) <= 0.05, (dim, got[dim], value)


def random_gates(cfg: ModelConfig, dims: tuple[str, ...], seed: int = 0) -> dict[str, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    sizes = Keep.everything(cfg)
    out = {"h": [torch.randn(len(sizes.h), generator=gen)]} if "h" in dims else {}
    return out | {d: [torch.randn(len(t), generator=gen) for t in getattr(sizes, d)] for d in dims if d != "h"}


def removed_units(cfg: ModelConfig, keep: Keep, gates, start: Keep | None = None):
    """(|alpha|, dim, layer, index) of every gated unit the keep drops."""
    start = start or Keep.everything(cfg)
    out = []
    for dim, per in gates.items():
        kept = [keep.h] if dim == "h" else getattr(keep, dim)
        alive = [start.h] if dim == "h" else getattr(start, dim)
        for layer, alpha in enumerate(per):
            gone = set(alive[layer].tolist()) - set(kept[layer].tolist())
            out += [(alpha[j].abs().item(), dim, layer, j) for j in gone]
    return sorted(out)


def put_back(keep: Keep, dim: str, layer: int, j: int) -> Keep:
    def add(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, torch.tensor([j])]).sort().values

    if dim == "h":
        return dataclasses.replace(keep, h=add(keep.h))
    per = list(getattr(keep, dim))
    per[layer] = add(per[layer])
    return dataclasses.replace(keep, **{dim: tuple(per)})


@pytest.mark.parametrize(
    ("variant", "fraction"),
    [("schubert-all", 0.3), ("schubert-all", 0.6), ("schubert-f", 0.05), ("schubert-a", 0.1), ("schubert-h", 0.2)],
)
def test_choose_removes_within_one_unit_of_the_plan(variant, fraction):
    cfg = SHAPES["per_layer"]
    gates, full = random_gates(cfg, VARIANTS[variant]), backbone_params(cfg)
    remove = int(fraction * full)
    keep = choose(cfg, gates, remove)
    removed = full - backbone_params(keep.config(cfg))
    assert removed >= remove
    last = removed_units(cfg, keep, gates)[-1]  # removed last: the largest |alpha| removed
    before = full - backbone_params(put_back(keep, *last[1:]).config(cfg))
    assert before < remove  # so removed - remove < the cost of the last unit
    for dim in DIMS:
        assert all(bool((t == t.sort().values).all()) for t in ([keep.h] if dim == "h" else getattr(keep, dim)))
    if variant != "schubert-all":  # only the gated dimensions shrink
        ungated = set(DIMS) - set(VARIANTS[variant])
        full_keep = Keep.everything(cfg)
        for dim in ungated:
            pairs = (
                [(keep.h, full_keep.h)]
                if dim == "h"
                else zip(getattr(keep, dim), getattr(full_keep, dim), strict=False)
            )
            assert all(torch.equal(a, b) for a, b in pairs)


def test_choose_takes_smallest_alpha_first():
    cfg = SHAPES["per_layer"]
    gates = random_gates(cfg, ("ffn",), seed=1)
    keep = choose(cfg, gates, 10 * unit_costs(cfg)["ffn"][0])
    gone = removed_units(cfg, keep, gates)
    kept = [gates["ffn"][i][t].abs().min().item() for i, t in enumerate(keep.ffn)]
    assert len(gone) >= 10 and max(a for a, *_ in gone) < min(kept)


def test_choose_never_removes_the_last_unit():
    cfg = SHAPES["per_layer"]
    keep = choose(cfg, random_gates(cfg, DIMS), backbone_params(cfg))  # more than can go
    assert len(keep.h) == 1
    for dim in LAYER_DIMS:
        assert [len(t) for t in getattr(keep, dim)] == [1, 1]


def test_choose_continues_from_a_keep():
    cfg = SHAPES["per_layer"]
    gates = random_gates(cfg, DIMS, seed=2)
    first = choose(cfg, gates, backbone_params(cfg) // 4)
    second = choose(cfg, gates, backbone_params(cfg) // 4, keep=first)
    start = backbone_params(first.config(cfg))
    assert start - backbone_params(second.config(cfg)) >= backbone_params(cfg) // 4
    for dim in DIMS:
        pairs = [(second.h, first.h)] if dim == "h" else zip(getattr(second, dim), getattr(first, dim), strict=False)
        assert all(set(a.tolist()) <= set(b.tolist()) for a, b in pairs)


@pytest.mark.parametrize("name", ["uniform", "per_layer", "e_ne_h"])
@pytest.mark.parametrize("fraction", [0.4, 0.7])
def test_uniform_hits_the_target(name, fraction):
    cfg = SHAPES[name]
    target = int(fraction * backbone_params(cfg))
    small = uniform(cfg, target)
    assert abs(backbone_params(small) - target) < unit_costs(small)["h"][0]
    assert backbone_params(small) == built(small)
    assert small.embed_dim == (small.hidden_dim if cfg.embed_dim == cfg.hidden_dim else cfg.embed_dim)
    assert [s.num_heads for s in small.layer_specs()] == [s.num_heads for s in cfg.layer_specs()]
    assert uniform(cfg, backbone_params(cfg)) == cfg


def test_uniform_bert_base_to_half():
    cfg = get_preset("bert-base")
    small = uniform(cfg, backbone_params(cfg) // 2)
    assert abs(backbone_params(small) / (backbone_params(cfg) // 2) - 1) < 0.002


def test_fewer_layers_is_nearest():
    cfg = get_preset("bert-base")
    target = 60_000_000
    small = fewer_layers(cfg, target)
    counts = {n: backbone_params(dataclasses.replace(cfg, num_layers=n)) for n in range(1, 13)}
    assert small.num_layers == min(counts, key=lambda n: abs(counts[n] - target))
    per_layer = fewer_layers(SHAPES["per_layer"], 1)
    assert per_layer.num_layers == 1 and per_layer.layers == SHAPES["per_layer"].layers[:1]


@pytest.mark.parametrize("name", ["per_layer", "e_ne_h"])
def test_magnitude_keep_takes_the_largest_units(name):
    cfg = SHAPES[name]
    torch.manual_seed(0)
    model = build_pretraining_model(cfg, ObjectiveConfig(sentence="none"))
    enc = model.encoder
    attn0, attn1 = enc.attentions[0].inner, enc.attentions[1].inner
    with torch.no_grad():  # plant big units: h 5, layer 1 head 1, layer 0 qk 2, layer 1 v 3, layer 0 ffn 7
        enc.attentions[0].inner.qkv.weight[:, 5] *= 100
        A, k, v = attn1.num_heads, attn1.qk_dim, attn1.v_dim
        attn1.qkv.weight[A * k + k : A * k + 2 * k] *= 100  # K rows of head 1
        attn0.qkv.weight[2 : attn0.num_heads * attn0.qk_dim : attn0.qk_dim] *= 100  # Q row 2 of every head
        attn1.out.weight[:, 3::v] *= 100  # output columns of v unit 3 in every head
        enc.ffn_stacks[0][0].inner.up.weight[7] *= 100
    new_cfg = uniform(cfg, backbone_params(cfg) // 2)
    keep = magnitude_keep(model, cfg, new_cfg)
    assert keep.config(cfg) == new_cfg
    assert 5 in keep.h.tolist() and 2 in keep.qk[0].tolist() and 3 in keep.v[1].tolist() and 7 in keep.ffn[0].tolist()
    ones = dataclasses.replace(
        new_cfg,
        hidden_dim=1,
        embed_dim=1 if cfg.embed_dim == cfg.hidden_dim else cfg.embed_dim,
        layers=(LayerSpec(num_heads=1, qk_dim=1, v_dim=1, ffn_dim=1),) * 2,
    )
    keep = magnitude_keep(model, cfg, ones)  # one unit of each: exactly the planted ones where planted
    assert keep.h.tolist() == [5] and keep.heads[1].tolist() == [1] and keep.qk[0].tolist() == [2]
    assert keep.v[1].tolist() == [3] and keep.ffn[0].tolist() == [7]
    with pytest.raises(ValueError, match="new_cfg"):
        magnitude_keep(model, cfg, dataclasses.replace(cfg, hidden_dim=cfg.hidden_dim + 4, embed_dim=10))
