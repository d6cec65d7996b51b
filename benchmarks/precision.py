"""``ablate bench precision``: bf16 autocast (and ``torch.compile``) against fp32 over 300
steps: speed, and the loss reached (bf16 must stay within 2% of fp32). On a CPU without fast
bf16 matmul kernels (:func:`ablate.benchmarks.ceiling.peaks`) bf16 is left out, and the output says so."""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch
from rich.progress import Progress

from ablate.benchmarks import mark
from ablate.benchmarks.cases import CASES
from ablate.benchmarks.ceiling import peaks
from ablate.benchmarks.sides import build_sides
from ablate.benchmarks.train_speed import batches, race, tokens_per_s

WARMUP = 3
TAIL = 20  # the loss reached = mean of the last 20 steps' losses
TOLERANCE = 0.02


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    steps = args.steps or 300
    task = progress.add_task("matmul peaks (fp32, bf16)", total=None)
    peak = peaks(device)
    progress.remove_task(task)
    lines, all_ok = [f"- {peak.note()}", ""], True
    for name in args.case or ["bert-small" if device.type == "cuda" else "albert-tiny"]:
        case = CASES[name]()
        settings = ["ablate:fp32", "ablate:bf16"] + (
            ["ablate:fp32:compile", "ablate:bf16:compile"] if args.compile else []
        )
        settings = [s for s in settings if s.split(":")[1] in peak.fast]
        task = progress.add_task(f"{name}: batches", total=None)
        data = batches(case, args.corpus, steps, device)
        sides = build_sides(case, settings, device, max_steps=steps)
        progress.update(task, description=f"{name}: {steps} steps x {len(sides)}", total=len(data), completed=0)
        race(sides, data, WARMUP, partial(progress.advance, task))
        progress.remove_task(task)
        fp32 = next(s for s in sides if s.name == "ablate fp32")
        reached = {s.name: statistics.mean(s.losses[-TAIL:]) for s in sides}
        speed = {s.name: tokens_per_s(s, data, WARMUP) for s in sides}
        lines += [
            f"### {name}: {steps} steps on the same batches ({args.corpus}), ablate only",
            "",
            "| setting | tokens/s | x fp32 | loss (mean of last 20 steps) | vs fp32 |",
            "|---|---:|---:|---:|---:|",
        ]
        for s in sides:
            gap = reached[s.name] / reached[fp32.name] - 1
            lines.append(
                f"| {s.name} | {speed[s.name]:,.0f} | {speed[s.name] / speed[fp32.name]:.2f} | "
                f"{reached[s.name]:.4f} | {gap:+.2%} |"
            )
            all_ok &= abs(gap) <= TOLERANCE
        lines += ["", f"- every setting within {TOLERANCE:.0%} of fp32's loss: {mark(all_ok)}", ""]
    return lines, all_ok
