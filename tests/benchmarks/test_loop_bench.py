"""``ablate bench loop`` on a tiny real run: a real ``ablate train`` (streamed data, MLflow,
validation) and the step alone in turns; the efficiency is the median turn's ratio of the two
rates, the phases add up, the last line states it. No timed assertion: speed is the benchmark's job."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ablate.benchmarks.cases import CASES
from ablate.benchmarks.loop import measure, report
from ablate.benchmarks.loop_clock import StepClock
from ablate.benchmarks.loop_floor import Floor, lightning_floor


def test_turns_split_the_steady_state_into_equal_blocks():
    clock = StepClock(warmup=3, steps=8, device=torch.device("cpu"), block=3)
    assert clock.boundaries == [3, 6, 9, 10]  # steps 4-6, 7-9 and 10 timed: 7 steps, as many alone
    assert StepClock(warmup=3, steps=8, device=torch.device("cpu")).boundaries == [3, 10]
    with pytest.raises(ValueError):
        StepClock(warmup=3, steps=1, device=torch.device("cpu"))


def test_a_tiny_run_reports_loop_over_step(wiki_validation):
    tiny = CASES["albert-tiny"]()
    case = replace(tiny, model=replace(tiny.model, vocab_size=2048, num_layers=1, max_position=32), seq_len=32, batch=4)
    r = measure(case, str(wiki_validation), torch.device("cpu"), warmup=2, steps=6, block=2)
    # steps 4 to 8 (1-based) in turns of 2, 2 and 1, and as many of the step alone
    assert [n for _, n in r.loop.blocks] == [n for _, n in r.step.blocks] == [2, 2, 1]
    for side in (r.loop, r.step):
        assert side.steps == 5 and side.tokens > 0 and all(s > 0 for s, _ in side.blocks)
        assert side.tokens <= 5 * case.batch * case.seq_len  # real tokens, padding not counted
        assert side.median_step_s == sorted(s / n for s, n in side.blocks)[1]
        assert side.tokens_per_s == pytest.approx(side.tokens / 5 / side.median_step_s)
    assert r.by_median == pytest.approx(r.loop.tokens_per_s / r.step.tokens_per_s)
    # turn by turn: the same batches on both sides, so each turn's ratio is the inverse of its times'
    assert r.loop.block_tokens == r.step.block_tokens and sum(r.loop.block_tokens) == r.loop.tokens
    turns = sorted((a / n) / (b / m) for (b, m), (a, n) in zip(r.loop.blocks, r.step.blocks, strict=True))
    assert r.efficiency == pytest.approx(turns[1])  # the median of 3 turns
    # the main thread's CPU time per block, beside the wall clock: never more than the block took
    for side in (r.loop, r.step):
        assert len(side.block_cpu) == 3 and all(
            0 < c <= s * 1.05 + 1e-3 for c, (s, _) in zip(side.block_cpu, side.blocks, strict=True)
        )
    cpu_gaps = sorted(
        a / n - b / m
        for a, (_, n), b, (_, m) in zip(r.loop.block_cpu, r.loop.blocks, r.step.block_cpu, r.step.blocks, strict=True)
    )
    assert r.host_cpu_ms == pytest.approx(1e3 * cpu_gaps[1])
    p = r.phases
    parts = [
        "data, tokenizer, model",
        "measurement",
        "run and Trainer",
        "first step",
        "training",
        "validation",
        "teardown",
    ]
    assert all(p[k] >= 0 for k in parts)
    assert sum(p[k] for k in parts) == pytest.approx(p["total"], rel=1e-6)
    assert p["measurement"] > 0 and p["validation"] > 0  # the run measured latency and validated
    assert p["step alone in the run"] > 0  # its turns are not counted in the run's phases
    lines, ok = report(r, "wiki")
    assert lines[-1] == f"loop efficiency: {r.efficiency:.2f}"
    assert not any("Lightning's own loop" in line for line in lines)  # no floor timed, none said
    assert ok == (r.efficiency >= 0.9)
    assert r.reads is not None and r.reads.per("training step") == 0  # pre-training reads nothing between log steps
    assert any(line.startswith("- device reads per log step: ") for line in lines)
    assert any(line.startswith("| the loop (ablate train) |") for line in lines)
    assert any(line.startswith("- loop efficiency turn by turn") for line in lines)
    assert f"- of it, the loop's own work: {r.host_cpu_ms:.2f} ms of the main thread's CPU time" in "\n".join(lines)
    floor = Floor(loop_ms=0.9, step_ms=0.25)
    with_floor, _ = report(r, "wiki", floor)
    said = next(line for line in with_floor if "Lightning's own loop at its barest" in line)
    assert "0.65 ms" in said and f"ablate's loop adds {r.host_ms - 0.65:.2f} ms" in said


def test_lightning_floor_times_a_bare_fit_against_its_step_by_hand():
    floor = lightning_floor(steps=40, warmup=5)
    assert floor.loop_ms > 0 and floor.step_ms > 0
    assert floor.host_ms == pytest.approx(floor.loop_ms - floor.step_ms)
