"""Quantization of built models: stored size, accuracy of the quantized forward, Q-BERT's mixed
precision plan, QAT, and the ``quant`` config section."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ObjectiveConfig, run_params
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.presets import get_preset
from ablate.lightning_modules.config.quant import QuantConfig
from ablate.lightning_modules.measure.accounting import count, report_for, stored_bytes
from ablate.lightning_modules.measure.measuring import random_batch
from ablate.lightning_modules.methods.quantization.apply import (
    convert_weight_qat,
    prepare_qat,
    prepare_weight_qat,
    quantize,
    quantized_like,
    quantized_report,
    targets,
    uniform_plan,
)
from ablate.lightning_modules.methods.quantization.mixed import average_bits, choose_plan, mixed_plan
from ablate.lightning_modules.model.heads import build_pretraining_model

V = 1000
SMALL = {
    "vocab_size": V,
    "embed_dim": 64,
    "hidden_dim": 64,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 128,
    "max_position": 64,
    "dropout": 0.0,
}


def tiny_model(preset: str = "bert-tiny", **overrides) -> nn.Module:
    torch.manual_seed(0)
    cfg = dataclasses.replace(get_preset(preset), **{**SMALL, **overrides})
    return build_pretraining_model(cfg, ObjectiveConfig()).eval()


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    return random_batch(V, 4, 32, torch.device("cpu"), seed=seed)


def linear_weights(model: nn.Module) -> int:
    """Weights (not biases) of the layers quantization applies to."""
    return sum(m.weight.numel() for m in targets(model).values())


def quantized_part_bytes(model: nn.Module, quantized: nn.Module) -> float:
    """Bytes the target layers' weights take in ``quantized``: everything else stays fp32 (4 bytes each)."""
    return stored_bytes(quantized) - 4 * (count(model) - linear_weights(model))


def logits(model: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(b).mlm_logits


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# --- stored size -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "overrides"), [("bert-tiny", {}), ("albert-tiny", {"embed_dim": 32, "sharing": "all"})]
)
def test_a_float_model_stores_four_bytes_per_unique_parameter(preset, overrides):
    model = tiny_model(preset, **overrides)
    unique = sum(p.numel() for p in model.parameters())  # shared layers once; the decoder is the word embedding
    assert stored_bytes(model) == 4 * unique
    # the MLM decoder has no weight of its own: it reads the word embedding (stored once)
    assert not [p for p in model.mlm_head.parameters() if p.dim() == 2 and p.shape[0] == V]
    if overrides.get("sharing") == "all":  # every layer runs the same weights: more layers, no more bytes
        assert stored_bytes(tiny_model(preset, **overrides, num_layers=4)) == stored_bytes(model)
        unshared = tiny_model(preset, **{**overrides, "sharing": "none"})
        assert stored_bytes(unshared) == 4 * sum(p.numel() for p in unshared.parameters()) > stored_bytes(model)


@pytest.mark.parametrize(
    ("method", "bytes_per_weight", "overhead"),
    [
        ("dynamic-int8", 1.0, 0.3),  # + fp64 scale and zero point per output row (16 bytes / >= 64 weights)
        ("weight-int8", 1.0, 0.2),  # + fp32 scale and int8 zero point per group of 32 (5 bytes / 32 weights)
        ("weight-int4", 0.5, 0.2),
        ("weight-int2", 0.25, 0.2),
    ],
)
def test_quantized_linear_weights_shrink_to_their_bits(method, bytes_per_weight, overhead):
    model = tiny_model()
    weights = linear_weights(model)
    quantized = quantize(copy.deepcopy(model), QuantConfig(method=method))
    part = quantized_part_bytes(model, quantized)
    assert bytes_per_weight * weights <= part <= (bytes_per_weight + overhead) * weights, part / weights
    assert stored_bytes(quantized) < stored_bytes(model)


def test_fewer_bits_store_fewer_bytes():
    model = tiny_model()
    size = {
        m: stored_bytes(quantize(copy.deepcopy(model), QuantConfig(method=m)))
        for m in ("weight-int8", "weight-int4", "weight-int2")
    }
    assert size["weight-int2"] < size["weight-int4"] < size["weight-int8"] < stored_bytes(model)
    # int8 -> int4 saves half a byte per weight, int4 -> int2 a quarter (scales are the same)
    weights = linear_weights(model)
    assert size["weight-int8"] - size["weight-int4"] == pytest.approx(weights / 2, abs=1)
    assert size["weight-int4"] - size["weight-int2"] == pytest.approx(weights / 4, abs=1)


@pytest.mark.parametrize("method", ["dynamic-int8", "weight-int8"])
def test_int8_logits_stay_close_to_the_float_models(method):
    model, b = tiny_model(), batch()
    ref = logits(model, b)
    # dynamic-int8 returns a new model and leaves the float one as it is; weight-only works in place
    quantized = quantize(model if method == "dynamic-int8" else copy.deepcopy(model), QuantConfig(method=method))
    out = logits(quantized, b)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert 0.0 < relative_error(out, ref) < 0.02  # changed (it is quantized), but only a little
    int2 = logits(quantize(copy.deepcopy(model), QuantConfig(method="weight-int2")), b)
    assert relative_error(out, ref) < relative_error(int2, ref)  # fewer bits, larger error
    assert torch.equal(logits(model, b), ref) and all(type(m.weight) is nn.Parameter for m in targets(model).values())


def test_dynamic_int8_shrinks_bert_base_to_at_most_60_percent():
    base = get_preset("bert-base")
    quantized = quantized_report(base, quant=QuantConfig(method="dynamic-int8")).model_bytes
    float_bytes = report_for(base).model_bytes
    assert quantized <= 0.6 * float_bytes, quantized / float_bytes


def test_params_report_refuses_weight_mixed():
    with pytest.raises(ConfigError) as err:
        quantized_report(get_preset("bert-tiny"), quant=QuantConfig(method="weight-mixed"))
    assert str(err.value).startswith("quant.method:") and "weight-mixed" in str(err.value)


def test_a_layer_group_size_does_not_divide_is_quantized_per_row():
    model = tiny_model(ffn_dim=100)  # the FFN's down projection reads 100 inputs: no groups of 32
    down = [n for n, m in targets(model).items() if m.in_features == 100]
    assert len(down) == 2
    quantized = quantize(copy.deepcopy(model), QuantConfig(method="weight-int4", group_size=32))
    layers = dict(quantized.named_modules())
    for name in targets(model):
        w = layers[name].weight
        assert type(w) not in (torch.Tensor, nn.Parameter), f"{name} left in float"
    for name in down:  # one group per row: int4 values + one fp32 scale and int8 zero point per row, fp32 bias
        layer = layers[name]
        assert layer.weight.block_size == (1, 100) and layer.weight.scale.shape == (64, 1)
        assert stored_bytes(layer) == 64 * 100 // 2 + 64 * 4 + 64 + 64 * 4
    grouped = [n for n, m in targets(model).items() if m.in_features == 64]
    assert all(layers[n].weight.block_size == (1, 32) for n in grouped)  # the others keep their groups
    assert torch.isfinite(logits(quantized, batch())).all()


# --- Q-BERT's mixed precision ------------------------------------------------------------------


MIXED = QuantConfig(method="weight-mixed", low_bits=4, high_bits=8, high_fraction=0.25)
SIZES = {"a": 100, "b": 100, "c": 300, "d": 100, "e": 400}  # 1000 weights: 250 may take high bits
SCORES = {"c": 5.0, "a": 4.0, "e": 3.0, "b": 2.0, "d": 1.0}


def test_mixed_plan_gives_high_bits_to_the_most_sensitive_layers_that_fit():
    plan = mixed_plan(SIZES, SCORES, MIXED)
    # c (300) is the most sensitive but over budget: passed over; a, then b fit (200 of 250); e, d do not
    assert plan == {"a": 8, "b": 8, "c": 4, "d": 4, "e": 4}
    high = sum(SIZES[n] for n, bits in plan.items() if bits == MIXED.high_bits)
    assert high <= MIXED.high_fraction * sum(SIZES.values())


def test_mixed_plan_reverse_gives_high_bits_to_the_least_sensitive():
    plan = mixed_plan(SIZES, SCORES, dataclasses.replace(MIXED, rank="reverse"))
    assert plan == {"a": 4, "b": 8, "c": 4, "d": 8, "e": 4}  # d, b (200), then e, a, c do not fit


def test_choose_plan_on_a_model_ranks_every_target_layer():
    model, b = tiny_model(), batch()
    ref = logits(model, b)

    plan, table = choose_plan(model, lambda m, b: m(b).mlm_loss, [b], MIXED)
    layers = targets(model)
    assert set(plan) == set(layers) and set(plan.values()) == {4, 8}
    assert MIXED.low_bits < average_bits(model, plan) < MIXED.high_bits
    assert len(table) == len(layers) and list(table["layer"]) == list(layers)
    assert dict(zip(table["layer"], table["bits"], strict=True)) == plan
    assert sorted(table["rank"]) == list(range(1, len(layers) + 1))
    assert table["sensitivity"].notna().all()
    top = table.loc[table["rank"] == 1].iloc[0]  # every layer fits the budget alone: the first one goes up
    assert top["weights"] <= MIXED.high_fraction * linear_weights(model) and top["bits"] == MIXED.high_bits
    # sensitivity quantized copies: the model is still float
    assert all(type(m.weight) is nn.Parameter for m in targets(model).values())
    assert torch.equal(logits(model, b), ref)
    # and the plan quantizes it
    quantized = quantize(copy.deepcopy(model), MIXED, plan)
    assert stored_bytes(quantized) < stored_bytes(model) and torch.isfinite(logits(quantized, b)).all()


def test_weight_mixed_needs_a_plan():
    with pytest.raises(ValueError, match="plan"):
        quantize(tiny_model(), MIXED)


# --- quantization-aware training ---------------------------------------------------------------


def test_qat_keeps_the_state_dict_trains_and_converts():
    model, b = tiny_model(), batch()
    ref = logits(model, b)
    keys = list(model.state_dict())
    prepared = prepare_qat(copy.deepcopy(model))
    assert list(prepared.state_dict()) == keys  # checkpoints and model/ artifacts load into a float model
    assert all(type(m) is not nn.Linear for n, m in prepared.named_modules() if n in targets(model))
    prepared.train()
    prepared(b).loss.backward()
    for name, layer in dict(prepared.named_modules()).items():
        if name in targets(model):
            assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0, name
    prepared.zero_grad()
    converted = quantize(prepared, QuantConfig(method="qat-int8"))
    out = logits(converted, b)
    assert out.shape == ref.shape and relative_error(out, ref) < 0.05
    assert stored_bytes(converted) < stored_bytes(model)


# --- the quant section of the config -----------------------------------------------------------


TINY = {"model": {"preset": "bert-tiny"}}


def test_a_quant_source_makes_the_quant_regime():
    cfg = build_config(TINY, {"quant.source": "runs:/x", "quant.method": "dynamic-int8"})
    assert cfg.regime == "quant"
    assert build_config(TINY, {"quant.source": "runs:/x"}).regime == "quant"
    assert build_config(TINY, {"quant.method": "dynamic-int8"}).regime == "pretrain"  # no source: post-training
    params = run_params(cfg)
    assert params["regime"] == "quant" and params["quant.source"] == "runs:/x"


@pytest.mark.parametrize(
    ("overrides", "key", "needle"),
    [
        ({"quant.source": "runs:/x", "distill.teacher": "runs:/y"}, "quant.source", "distill.teacher"),
        ({"quant.method": "qat-int8", "prune.source": "runs:/x"}, "quant.method", "qat-int8"),
        ({"quant.method": "weight-mixed", "quant.low_bits": 4, "quant.high_bits": 4}, "quant.high_bits", "low_bits"),
        ({"quant.method": "weight-mixed", "quant.low_bits": 6, "quant.high_bits": 3}, "quant.high_bits", "low_bits"),
        ({"quant.method": "weight-int7"}, "quant.method", ""),
        ({"quant.low_bits": 1}, "quant.low_bits", ""),
        ({"quant.method": "weight-int4", "quant.group_size": 48}, "quant.group_size", "divides none"),
        ({"quant.method": "qat-int8", "quant.qat_steps": 10}, "quant.qat_steps", "weight-only"),
        ({"quant.method": "dynamic-int8", "quant.qat_steps": 10}, "quant.qat_steps", "weight-only"),
        ({"quant.method": "weight-int4", "quant.qat_steps": 10}, "quant.qat_steps", "regime 'pretrain'"),
        ({"quant.embeddings": "int2"}, "quant.embeddings", ""),
    ],
)
def test_bad_quant_configs_are_one_error_naming_the_key(overrides, key, needle):
    with pytest.raises(ConfigError) as err:
        build_config(TINY, overrides)
    message = str(err.value)
    assert message.startswith(f"{key}:") and needle in message and "\n" not in message, message


def test_run_params_log_the_quant_fields_the_method_uses():
    quant = {k for k in run_params(build_config(TINY)) if k.startswith("quant.")}
    assert quant == {"quant.method", "quant.embeddings"}
    params = run_params(build_config(TINY, {"quant.method": "weight-int4"}))
    expected = {"quant.method", "quant.embeddings", "quant.group_size", "quant.qat_steps"}
    assert {k for k in params if k.startswith("quant.")} == expected
    assert params["quant.method"] == "weight-int4" and params["quant.group_size"] == 32
    mixed = {k for k in run_params(build_config(TINY, {"quant.method": "weight-mixed"})) if k.startswith("quant.")}
    assert {"quant.low_bits", "quant.high_bits", "quant.high_fraction", "quant.rank", "quant.sensitivity"} <= mixed
    assert "quant.source" not in mixed and "quant.hessian_iters" not in mixed
    hessian = run_params(build_config(TINY, {"quant.method": "weight-mixed", "quant.sensitivity": "hessian"}))
    assert hessian["quant.sensitivity"] == "hessian" and "quant.hessian_iters" in hessian


@pytest.mark.parametrize(
    ("q", "bits"),
    [(QuantConfig(method="weight-mixed", low_bits=4), 4), (QuantConfig(method="qat-int8"), 8)],
)
def test_quantized_like_builds_what_a_run_ends_with_for_timing(q, bits):
    """``ablate report --remeasure`` times a quantized run on a model built from its config: mixed
    precision at its low width (the same kernels), QAT as converted int8 layers."""
    model = tiny_model()
    timed = quantized_like(copy.deepcopy(model), q)
    expected = 4 * (count(model) - linear_weights(model)) + bits / 8 * linear_weights(model)
    assert stored_bytes(timed) == pytest.approx(expected, rel=0.2)
    assert stored_bytes(timed) < stored_bytes(model)
    assert torch.isfinite(logits(timed, batch())).all()


# --- Q-BERT: Hessian sensitivity, low-bit QAT, quantized embeddings -----------------------------


def test_hessian_plan_ranks_by_mean_plus_std_and_keeps_the_eigenvalues():
    model, batches = tiny_model(), [batch(0), batch(1)]
    ref = logits(model, batches[0])
    q = dataclasses.replace(MIXED, sensitivity="hessian", hessian_iters=10)
    plan, table = choose_plan(model, lambda m, b: m(b).mlm_loss, batches, q)
    assert set(plan) == set(targets(model)) and set(plan.values()) <= {4, 8}
    assert {"eigenvalue_mean", "eigenvalue_std", "eigenvalues"} <= set(table.columns)
    expected = table["eigenvalue_mean"] + table["eigenvalue_std"]
    assert list(table["sensitivity"]) == pytest.approx(list(expected))
    assert all(len(v.split()) == 2 for v in table["eigenvalues"])  # one per batch
    top = table.loc[table["rank"] == 1].iloc[0]
    assert top["sensitivity"] == table["sensitivity"].max() and top["bits"] == q.high_bits
    assert torch.equal(logits(model, batches[0]), ref)  # the model is left as it was


@pytest.mark.parametrize(("kind", "bits"), [("int8", 8), ("int4", 4)])
def test_embedding_tables_quantize_per_row_and_count_in_model_bytes(kind, bits):
    model, b = tiny_model(), batch()
    ref = logits(model, b)
    quantized = quantize(copy.deepcopy(model), QuantConfig(embeddings=kind))
    tables = [model.encoder.embeddings.word.weight, model.encoder.embeddings.token_type.weight]
    # each row: its values at `bits`, one fp32 scale and one int8 zero point, against 4 bytes a value
    saved = sum(4 * w.numel() - (bits / 8 * w.numel() + 5 * w.shape[0]) for w in tables)
    assert stored_bytes(model) - stored_bytes(quantized) == pytest.approx(saved, abs=8)
    out = logits(quantized, b)  # the tied MLM decoder reads the quantized word table
    assert relative_error(out, ref) < (0.05 if bits == 8 else 0.5)
    assert type(quantized.encoder.embeddings.position.weight) is nn.Parameter  # the position table stays float


def test_bert_base_with_4_bit_groups_and_int8_embeddings_is_a_fifth_of_fp32():
    """Q-BERT's size: ``ablate params bert-base quant.method=weight-int4 quant.embeddings=int8``."""
    from ablate.lightning_modules.measure.accounting import report_for

    base = get_preset("bert-base")
    fp32 = report_for(base).model_bytes
    q = quantized_report(base, quant=QuantConfig(method="weight-int4", group_size=32, embeddings="int8")).model_bytes
    assert q / fp32 <= 0.2, q / fp32


@pytest.mark.parametrize("bits", [2, 4])
def test_weight_qat_trains_fake_quantized_and_converts_to_what_it_trained(bits):
    model, b = tiny_model(), batch()
    keys = list(model.state_dict())
    q = QuantConfig(method=f"weight-int{bits}", group_size=32, qat_steps=5, embeddings="int8")
    plan = uniform_plan(model, bits)
    prepared = prepare_weight_qat(copy.deepcopy(model), plan, q)
    assert list(prepared.state_dict()) == keys  # model/ artifacts load into a float model
    assert not targets(prepared)  # every target layer is fake-quantized now
    prepared.train()
    prepared(b).loss.backward()
    assert prepared.encoder.embeddings.word.weight.grad is not None
    prepared.zero_grad()
    fake = logits(prepared.eval(), b)
    converted = convert_weight_qat(copy.deepcopy(prepared), plan, q)
    # the converted layers compute what the fake-quantized ones trained with (up to rounding)
    assert relative_error(logits(converted, b), fake) < 0.02
    direct = quantize(copy.deepcopy(model), dataclasses.replace(q, qat_steps=0))
    assert stored_bytes(converted) == stored_bytes(direct) < stored_bytes(model) / 3
