"""Timing a run's model again from its config (``ablate report --remeasure``'s measuring side): the model
rebuilt with random weights, quantized by the methods layer's quantizer, timed a round at a time."""

from __future__ import annotations

import torch

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure import profiling
from ablate.lightning_modules.measure.accounting import stored_bytes
from ablate.lightning_modules.measure.reference_load import Workload
from ablate.lightning_modules.measure.retime import Retimed, rebuilt, timing_device
from ablate.lightning_modules.methods.quantization.apply import quantized_like

TINY = {"model": {"preset": "bert-tiny"}, "data": {"max_length": 16}, "trainer": {"accelerator": "cpu"}}


def test_seeds_share_an_architecture_and_a_round_times_every_batch_size() -> None:
    cfg = build_config(TINY)
    timing = Retimed.of(cfg)
    assert timing.device == torch.device("cpu") and timing.key == Retimed.of(build_config({**TINY, "seed": 7})).key
    assert timing.key != Retimed.of(build_config({**TINY, "data": {"max_length": 32}})).key
    reference: Workload = timing.workload()
    for _ in range(2):
        timing.time_round(quantized_like, repeats=2, warmup=0, reference=reference)
    assert all(len(timing.times[b]) == 4 == len(timing.refs[b]) for b in profiling.LATENCY_BATCHES)
    metrics = timing.metrics()
    assert metrics["latency_ms_b1"] == min(timing.times[1]) > 0
    assert set(metrics) == {
        profiling.latency_metric(b) + s
        for b in profiling.LATENCY_BATCHES
        for s in ("", profiling.SPREAD_SUFFIX, profiling.REFERENCE_SUFFIX)
    }
    assert timing.describe()[0].startswith("cpu (")


def test_a_rebuilt_model_is_the_same_every_time_and_quantized_as_its_run_was() -> None:
    cfg = build_config(TINY)
    before = torch.random.get_rng_state()
    a, b = rebuilt(cfg, quantized_like), rebuilt(cfg, quantized_like)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's random stream untouched
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    quant = build_config({**TINY, "quant": {"method": "qat-int8"}})
    assert timing_device(quant) == torch.device("cpu")
    assert stored_bytes(rebuilt(quant, quantized_like)) < stored_bytes(a)
