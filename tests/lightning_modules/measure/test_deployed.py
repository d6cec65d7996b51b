"""Timing a deployed model (lightning_modules/measure/deployed.py): the CPU's instruction sets, one thread and
every thread, rounds in turns, a busy round outrun by quiet ones."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure import deployed, profiling
from ablate.lightning_modules.measure.deployed import (
    ALL_THREADS,
    Call,
    TorchTarget,
    Turns,
    describe_instruction_sets,
    instruction_sets,
    latency_names,
    thread_settings,
)
from ablate.lightning_modules.measure.reference_load import reference_workload
from ablate.lightning_modules.model.heads import build_pretraining_model


def test_instruction_sets_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx_vnni\nmodel name\t: X\n")
    assert instruction_sets(info) == {"AVX2": True, "AVX-512": True, "VNNI": True, "AMX": False}
    assert describe_instruction_sets(instruction_sets(info)) == "AVX2 yes, AVX-512 yes, VNNI yes, AMX no"
    assert instruction_sets(tmp_path / "absent") is None
    assert describe_instruction_sets({"AVX2": False}) == "AVX2 no"
    here = instruction_sets()
    assert here is None or set(here) == {"AVX2", "AVX-512", "VNNI", "AMX"}


def test_a_torch_model_is_timed_at_one_thread_and_every_thread_and_threads_are_restored() -> None:
    cfg = build_config({"model": {"preset": "bert-tiny", "vocab_size": 500}})
    model = build_pretraining_model(cfg.model, cfg.objective)
    seen: list[int] = []

    def forward(m: torch.nn.Module, batch: dict[str, torch.Tensor]) -> object:
        seen.append(torch.get_num_threads())
        return m.get_submodule("encoder")(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    before = torch.get_num_threads()
    turns = Turns(TorchTarget(model, forward, 500, 16))
    settings = thread_settings()
    for _ in range(2):
        turns.time_round(repeats=2, warmup=1, reference=reference_workload("cpu"), settings=settings)
    assert torch.get_num_threads() == before
    assert set(seen) == {1, settings[ALL_THREADS]}  # each forward under its setting's threads
    metrics = turns.metrics()
    suffixes = ("", profiling.SPREAD_SUFFIX, profiling.REFERENCE_SUFFIX)
    assert set(metrics) == {name + s for name in latency_names() for s in suffixes}
    assert latency_names() == ("latency_ms_b1", "latency_ms_b32", "latency_ms_b1_all", "latency_ms_b32_all")
    assert all(len(t) == 4 for t in turns.times.values())  # 2 rounds x 2 repeats, per setting and batch
    assert metrics["latency_ms_b32"] == min(turns.times[("", 32)]) > 0


@dataclass
class Sleeper:
    """A target whose forward sleeps: ``slow`` ms in the rounds listed, ``fast`` ms otherwise."""

    slow_rounds: tuple[int, ...]
    fast: float = 2.0
    slow: float = 30.0
    label: str = "sleep"
    device: torch.device = torch.device("cpu")
    round: int = 0

    def call(self, threads: int, batch: int) -> Call:
        ms = self.slow if self.round in self.slow_rounds else self.fast
        return lambda: time.sleep(ms / 1e3)


def _timed(*slow_rounds: int) -> dict[str, float]:
    target = Sleeper(slow_rounds)
    turns = Turns(target)
    for r in range(3):
        target.round = r
        turns.time_round(4, 0, lambda: None, {"": 1})
    return turns.metrics()


def test_a_busy_round_is_outrun_by_quiet_ones_or_marked() -> None:
    one = _timed(0)  # the first round ran beside something else: the quiet rounds give the figure
    assert 2.0 <= one["latency_ms_b32"] < 10.0 and one["latency_ms_b32_spread"] < 1.0
    two = _timed(0, 2)  # most of it was busy: still the fastest, but its spread says so
    assert 2.0 <= two["latency_ms_b32"] < 10.0 and two["latency_ms_b32_spread"] > 1.0
    assert deployed.all_threads() >= 1
