"""``ablate bench train`` end to end on a tiny distillation case: the matmul peaks first (a
precision without fast kernels left out, and said), then each case, saying what it does on stderr
as plain lines when that is not a terminal. No timed assertion: speed is the benchmark's job."""

from __future__ import annotations

import argparse
import io
import re
from dataclasses import replace

import torch
from rich.console import Console

from ablate.benchmarks import train_table
from ablate.benchmarks.cases import CASES
from ablate.benchmarks.ceiling import fast_kernels, peaks
from ablate.benchmarks.status import LineProgress, progress_for


def test_a_busy_log_reads_top_to_bottom():
    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    progress = progress_for(console)
    assert isinstance(progress, LineProgress)
    with progress:
        task = progress.add_task("case: batches", total=None)
        progress.update(task, description="case: 2 sides", total=3)
        progress.advance(task)
        progress.update(task, description="case: 2 sides")  # unchanged: not said again
        progress.remove_task(task)
    lines = console.file.getvalue().splitlines()
    assert [re.sub(r"^\[ *[\d.]+ s\] ", "", line) for line in lines] == ["case: batches", "case: 2 sides"]


def test_peaks_leave_out_what_has_no_fast_kernels():
    cpu = torch.device("cpu")
    p = peaks(cpu, budget_s=0.05)
    assert p.fast[0] == "fp32" and p.flops["fp32"] > 0
    assert ("bf16" in p.left_out) == (not fast_kernels("bf16", cpu))
    assert set(p.flops) == set(p.fast) and set(p.fast) | set(p.left_out) == {"fp32", "bf16"}
    assert p.best(replace(p, flops={k: 2 * v for k, v in p.flops.items()})).flops == {
        k: 2 * v for k, v in p.flops.items()
    }


def test_bench_train_runs_a_distillation_case_and_says_so(monkeypatch, wiki_validation):
    case = CASES["distill-mini"]()

    def small(model):
        return replace(model, num_layers=1, vocab_size=2048, max_position=32)

    tiny = replace(case, name="tiny", model=small(case.model), teacher=small(case.teacher), seq_len=32, batch=4)
    monkeypatch.setitem(train_table.CASES, "tiny", lambda: tiny)
    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    args = argparse.Namespace(steps=2, case=["tiny"], compile=False, corpus=str(wiki_validation))
    with progress_for(console) as progress:
        lines, _ = train_table.main(args, torch.device("cpu"), progress)
    log = [re.sub(r"^\[ *[\d.]+ s\] ", "", line) for line in console.file.getvalue().splitlines()]
    precisions = 1 + fast_kernels("bf16", torch.device("cpu"))  # fp32, and bf16 where this CPU has its kernels
    assert log[0] == "matmul peaks (fp32, bf16)" and f"tiny: {2 * precisions} sides, one step each in turn" in log
    assert lines[2].startswith("- measured matmul peaks: fp32 ")
    assert ("bf16 left out" in lines[2]) == (not fast_kernels("bf16", torch.device("cpu")))
    table = [line for line in lines if line.startswith("| ablate fp32 |") or line.startswith("| transformers eager")]
    # the ablate fp32 row, and transformers' eager row in each precision
    assert len(table) == 1 + precisions and any("distillation, teacher" in line for line in lines)
    assert any("same work" in line and "ok at" in line for line in lines)
