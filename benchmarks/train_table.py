"""``ablate bench train``: the ablate vs transformers table, one block per case."""

from __future__ import annotations

import argparse
import statistics

import torch
from rich.progress import Progress

from benchmarks import mark
from benchmarks.cases import CASES
from benchmarks.ceiling import Ceiling, matmul_peak, step_flops
from benchmarks.train_speed import Side, activation_mb, batches, build_sides, race, tokens_per_s

FP32 = ["ablate:fp32", "transformers:sdpa:fp32", "transformers:eager:fp32"]
BF16 = ["ablate:bf16", "transformers:sdpa:bf16", "transformers:eager:bf16"]
WARMUP = 3
SAME_START = 1e-4  # first-step losses from the same weights on the same batch agree this closely


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    from benchmarks.cli import TARGETS

    steps = args.steps or 20
    names = args.case or list(CASES)
    lines = [f"ablate vs transformers, training steps (forward, backward, AdamW) at the same configuration, "
             f"same weights and batches ({args.corpus}); {WARMUP} warm-up steps, then the median of {steps} "
             f"alternating steps.", ""]
    all_ok = True
    peaks: dict[str, float] = {}  # matmul peak per precision, measured once
    for name in names:
        case = CASES[name]()
        settings = FP32 + BF16 + (["ablate:fp32:compile", "ablate:bf16:compile"] if args.compile else [])
        task = progress.add_task(f"{name}: batches", total=None)
        data = batches(case, args.corpus, WARMUP + steps, device)
        sides = build_sides(case, settings, device, max_steps=WARMUP + steps)
        progress.update(task, description=f"{name}: {len(sides)} sides", total=len(data), completed=0)
        race(sides, data, WARMUP, lambda: progress.advance(task))
        progress.remove_task(task)
        speed = {s.name: tokens_per_s(s, data, WARMUP) for s in sides}
        for s in sides:
            s.activation_mb = activation_mb(s, data[0], device)
        block, ok = _block(name, case, sides, speed, TARGETS[name])
        lines += block[:-1] + _ceiling(sides, speed, data[WARMUP], device, peaks)  # block ends in a blank line
        all_ok &= ok
    return lines, all_ok


def _block(name: str, case, sides: list[Side], speed: dict[str, float],
           targets: tuple[float, float | None]) -> tuple[list[str], bool]:
    hf_fp32 = max(speed[s.name] for s in sides if s.library == "transformers" and s.precision == "fp32")
    hf_best = max(speed[s.name] for s in sides if s.library == "transformers")
    ours_fp32 = speed["ablate fp32"]
    ours_best = max(speed[s.name] for s in sides if s.library == "ablate")
    reference = next(s for s in sides if s.name == "ablate fp32")
    first_gap = max(abs(s.losses[0] - reference.losses[0]) for s in sides if s.precision == "fp32")
    m = case.model
    lines = [f"### {name}: V={m.vocab_size} H={m.hidden_dim} E={m.embed_dim} L={m.num_layers} A={m.num_heads} "
             f"FFN={m.ffn_dim}x{m.num_ffn} sharing={m.sharing}, T={case.seq_len} B={case.batch}, MLM + "
             f"{case.sentence.upper()}", "",
             "| side | tokens/s | x transformers fp32 | activations MiB | loss step 1 | loss last step |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in sorted(sides, key=lambda s: -speed[s.name]):
        lines.append(f"| {s.name} | {speed[s.name]:,.0f} | {speed[s.name] / hf_fp32:.2f} | {s.activation_mb:.1f} | "
                     f"{s.losses[0]:.5f} | {s.losses[-1]:.4f} |")
    fp32_target, best_target = targets
    ok = ours_fp32 / hf_fp32 >= fp32_target and first_gap <= SAME_START
    lines += ["", f"- fp32 against fp32 (transformers' faster attention): **{ours_fp32 / hf_fp32:.2f}x** "
                  f"(target {fp32_target}x: {mark(ours_fp32 / hf_fp32 >= fp32_target)})"]
    best_line = f"- best against best: **{ours_best / hf_best:.2f}x**"
    if best_target is not None:
        best_line += f" (target {best_target}x: {mark(ours_best / hf_best >= best_target)})"
        ok &= ours_best / hf_best >= best_target
    lines += [best_line, f"- same work: fp32 losses at step 1 differ by at most {first_gap:.1e} "
                         f"({mark(first_gap <= SAME_START)} at {SAME_START:.0e}); last-step losses above", ""]
    return lines, ok


def _ceiling(sides: list[Side], speed: dict[str, float], batch: dict[str, torch.Tensor], device: torch.device,
             peaks: dict[str, float]) -> list[str]:
    """The work of each side's best step and how fast ablate's could go at the machine's peak."""
    ours = max((s for s in sides if s.library == "ablate"), key=lambda s: speed[s.name])
    theirs = max((s for s in sides if s.library == "transformers"), key=lambda s: speed[s.name])
    # a compiled side does the eager side's arithmetic; count FLOPs on the eager one
    eager = next(s for s in sides if s.name == f"ablate {ours.precision}")
    if ours.precision not in peaks:
        peaks[ours.precision] = matmul_peak(ours.precision, device)
    ceiling = Ceiling(step_flops(eager, batch), peaks[ours.precision])
    their_flops = step_flops(theirs, batch)
    ours_s, theirs_s = statistics.median(ours.times), statistics.median(theirs.times)
    return [f"- work per step (forward + backward, torch's FlopCounterMode): ablate {ceiling.flops / 1e9:.1f} GFLOP, "
            f"transformers {their_flops / 1e9:.1f} GFLOP",
            f"- {ours.name} runs at {ceiling.flops / ours_s / 1e9:.0f} GFLOP/s, "
            f"{ceiling.flops / ours_s / ceiling.peak:.0%} of this machine's {ours.precision} matmul peak "
            f"({ceiling.peak / 1e9:.0f} GFLOP/s, 2048^3); {theirs.name} at {their_flops / theirs_s / 1e9:.0f} GFLOP/s",
            f"- ceiling: with all of its work at that peak and nothing else costing time, ablate's step would take "
            f"{ceiling.min_step_s * 1e3:.0f} ms against {ours_s * 1e3:.0f} ms now: best against best could reach at "
            f"most **{theirs_s / ceiling.min_step_s:.2f}x**", ""]
