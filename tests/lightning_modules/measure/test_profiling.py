"""Measured latency and training activation memory (lightning_modules.profiling), and ``ablate params --measure``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure.measuring import (
    autocast_for,
    cpu_model,
    describe_device,
    describe_machine,
    training_device,
)
from ablate.lightning_modules.measure.memory import peak_train_memory
from ablate.lightning_modules.measure.profiling import (
    Latency,
    Measured,
    measure,
    measure_latencies,
    measure_latency,
    time_forward,
)
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model
from tests import forked

ROOT = Path(__file__).resolve().parents[3]
V = 8192  # albert-tiny's vocabulary


def tiny(**model: object) -> PretrainingModel:
    cfg = build_config({"model": {"preset": "albert-tiny", **model}})
    assert cfg.model.vocab_size == V
    return build_pretraining_model(cfg.model, cfg.objective)


@pytest.fixture(scope="module")
def model() -> PretrainingModel:
    torch.manual_seed(0)
    return tiny()


def test_latency_positive_and_grows_with_batch(model: PretrainingModel) -> None:
    # the best of three runs of 5 repeats (each already the fastest), and 128x the work: robust to a busy machine
    b1 = min(measure_latency(model, V, batch=1, seq_len=32, repeats=5, warmup=1) for _ in range(3))
    b128 = min(measure_latency(model, V, batch=128, seq_len=32, repeats=5, warmup=1) for _ in range(3))
    assert 0 < b1 < b128


def test_latency_is_the_fastest_repeat_beside_its_spread(model: PretrainingModel) -> None:
    assert Latency((3.0, 1.0, 2.0)).min_ms == 1.0 and Latency((3.0, 1.0, 2.0)).median_ms == 2.0
    assert Latency((3.0, 1.0, 2.0)).spread == 1.0  # (median - min) / min: the median repeat took twice the fastest
    lat = time_forward(model, V, batch=2, seq_len=16, repeats=5, warmup=1)
    assert len(lat.times_ms) == 5 and 0 < lat.min_ms <= lat.median_ms
    assert lat.spread == pytest.approx((lat.median_ms - lat.min_ms) / lat.min_ms) and lat.spread >= 0
    got = measure_latencies(model, V, seq_len=16, repeats=3, warmup=0)
    assert set(got) == {f"latency_ms_b{b}{s}" for b in (1, 32) for s in ("", "_spread", "_reference")}
    assert got["latency_ms_b1"] > 0 and got["latency_ms_b32"] > 0
    assert got["latency_ms_b1_spread"] >= 0 and got["latency_ms_b32_spread"] >= 0
    with pytest.raises(ValueError, match="repeats"):
        time_forward(model, V, batch=1, seq_len=8, repeats=0)


def test_activation_memory_is_linear_in_batch_and_length(model: PretrainingModel) -> None:
    base = peak_train_memory(model, V, batch=4, seq_len=32)
    assert base > 0
    # dropout 0: the attention kernel keeps O(T) per head, so memory is ~linear in T as well as in B
    assert peak_train_memory(model, V, batch=8, seq_len=32) / base == pytest.approx(2.0, rel=0.1)
    assert peak_train_memory(model, V, batch=4, seq_len=64) / base == pytest.approx(2.0, rel=0.15)


def test_dropout_masks_cost_activation_memory() -> None:
    torch.manual_seed(0)
    without = peak_train_memory(tiny(dropout=0.0), V, batch=8, seq_len=32)
    with_dropout = peak_train_memory(tiny(dropout=0.1), V, batch=8, seq_len=32)
    # every dropout saves a mask (and attention dropout keeps the T x T probabilities): ~+40% here
    assert with_dropout > 1.2 * without


def test_measuring_leaves_model_and_random_stream_unchanged() -> None:
    torch.manual_seed(0)
    m = tiny(dropout=0.1)
    m.train()
    m.mlm_head.eval()  # a mixed state must come back as it was
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rng = torch.get_rng_state()
    got = measure(m, V, seq_len=16, repeats=1, warmup=0, memory_batch=2)
    assert isinstance(got, Measured) and got.device == f"cpu ({torch.get_num_threads()} threads)"
    assert got.latency_ms_b1 > 0 and got.latency_ms_b32 > 0 and got.train_activation_mb > 0
    assert got.latency_ms_b1_spread == 0 and got.latency_ms_b32_spread == 0  # one repeat: nothing to disagree
    assert m.training and not m.mlm_head.training and m.encoder.training
    assert all(p.grad is None for p in m.parameters())
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)


def test_params_measure_json_has_measured_keys() -> None:
    args = ["params", "albert-tiny", "data.max_length=32", "--measure", "--json"]
    out = forked.run(args, cwd=ROOT, env=os.environ, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"backbone", "flops_per_token", "latency_ms_b1", "latency_ms_b32", "train_activation_mb", "device"} <= set(
        data
    )
    assert data["latency_ms_b1_spread"] >= 0 and data["latency_ms_b32_spread"] >= 0
    # the CLI's plumbing; their order is test_latency_positive_and_grows_with_batch's (robust to a busy machine)
    assert data["device"].startswith(("cpu (", "cuda:")) and data["latency_ms_b1"] > 0 and data["latency_ms_b32"] > 0
    assert data["train_activation_mb"] > 0


def test_params_measure_table(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ablate import cli, commands

    monkeypatch.setattr(commands, "_measure", lambda cfg: Measured(1.25, 31.5, 42.0, "cpu"))  # rendering only: fast
    assert cli.main(["params", "albert-tiny", "--measure"]) == 0
    table = capsys.readouterr().out
    assert "latency, batch 1" in table and "latency, batch 32" in table and "activation memory" in table
    assert "1.25" in table and "31.50" in table and "42.0" in table
    assert cli.main(["params", "albert-tiny", "--json"]) == 0  # without --measure: as before, no model built
    assert "latency_ms_b1" not in json.loads(capsys.readouterr().out)


def test_the_training_device_is_resolved_as_lightning_resolves_the_accelerator() -> None:
    cuda = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert training_device("cpu") == torch.device("cpu")
    assert training_device("auto") == cuda and training_device("gpu") == cuda and training_device("cuda") == cuda
    assert describe_device("cpu") == f"cpu ({torch.get_num_threads()} threads)"
    assert cpu_model() and describe_machine("cpu") == f"{describe_device('cpu')}, {cpu_model()}"
    if torch.cuda.is_available():
        assert describe_device(cuda) == f"cuda:0 ({torch.cuda.get_device_name(0)})"


def test_bf16_runs_measure_under_the_runs_autocast() -> None:
    cpu = torch.device("cpu")
    with autocast_for("bf16-mixed", cpu):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with autocast_for("32-true", cpu):
        assert not torch.is_autocast_enabled("cpu")
    torch.manual_seed(0)
    m = tiny(dropout=0.0)
    fp32 = peak_train_memory(m, V, batch=32, seq_len=64)
    bf16 = peak_train_memory(m, V, batch=32, seq_len=64, precision="bf16-mixed")
    # matmul activations in bf16 (norms, softmax and the loss stay fp32; autocast's bf16 weight
    # copies count too, so a tiny batch would not show it): ~0.7x here
    assert 0 < bf16 < 0.8 * fp32
    assert measure_latency(m, V, batch=2, seq_len=16, repeats=1, warmup=0, precision="bf16-mixed") > 0
    assert all(p.dtype == torch.float32 for p in m.parameters())


def test_a_compiled_model_is_measured_uncompiled_and_stays_compiled() -> None:
    torch.manual_seed(0)
    m = tiny(dropout=0.0)
    m.compile()
    compiled = m._compiled_call_impl
    frames = torch._dynamo.utils.counters["frames"]["total"]
    got = measure(m, V, seq_len=16, repeats=1, warmup=0, memory_batch=2)
    assert torch._dynamo.utils.counters["frames"]["total"] == frames  # dynamo saw no frame: nothing compiled
    assert got.train_activation_mb > 0 and m._compiled_call_impl is compiled
