"""``ablate bench train``: the ablate vs transformers table, one block per case: per side tokens/s,
ms/step, FLOPs, FLOP/s and MFU, activation memory, losses and a compiled side's first step; the case's
targets (:class:`ablate.benchmarks.cases.Case`) checked below it, the ratios against "transformers'
best" (its fastest side, compiled included). Peaks first (:func:`ablate.benchmarks.ceiling.peaks`)."""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch
from rich.progress import Progress

from ablate.benchmarks import mark
from ablate.benchmarks.cases import CASES, Case, default_cases
from ablate.benchmarks.ceiling import Ceiling, Peaks, peaks, step_flops
from ablate.benchmarks.sides import build_sides
from ablate.benchmarks.train_speed import Side, activation_mb, batches, race, tokens_per_s
from ablate.lightning_modules.config.model import ModelConfig

FP32 = ["ablate:fp32", "transformers:sdpa:fp32", "transformers:eager:fp32"]
BF16 = ["ablate:bf16", "transformers:sdpa:bf16", "transformers:eager:bf16"]
COMPILED = [
    "ablate:fp32:compile",
    "ablate:bf16:compile",
    "transformers:sdpa:fp32:compile",
    "transformers:sdpa:bf16:compile",
]
GPU_COMPILED = [  # fp32 compiled adds minutes, not news
    "ablate:bf16:compile",
    "ablate:bf16:compile:cudagraphs",
    "transformers:sdpa:bf16:compile",  # the fastest way a user runs transformers: the ratios are against it
]
WARMUP = 3
SAME_START = {
    "cpu": 1e-4,
    "cuda": 5e-3,
}  # first-step fp32 losses from the same weights agree this closely (TF32 on CUDA)


def settings_for(case: Case, device: torch.device, compiled: bool, fast: tuple[str, ...]) -> list[str]:
    """The sides a case runs: fp32 and bf16 (those with fast kernels here), compiled where asked (ablate's and
    transformers' SDPA sides); a distillation case has no transformers SDPA side (SDPA returns no attention
    probabilities), so no compiled transformers side either."""
    settings = FP32 + BF16 + (GPU_COMPILED if device.type == "cuda" else COMPILED if compiled else [])

    def precision(setting: str) -> str:  # ablate:bf16[:compile], transformers:sdpa:bf16[:compile]
        parts = setting.split(":")
        return parts[2] if parts[0] == "transformers" else parts[1]

    settings = [s for s in settings if precision(s) in fast]
    if case.teacher is not None:  # no SDPA side (no attention probabilities); the distillation step has no CUDA graphs
        settings = [s for s in settings if not s.startswith("transformers:sdpa") and "cudagraphs" not in s]
    return settings


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    steps = args.steps or 20
    names = args.case or default_cases(device.type)
    compiled = args.compile or device.type == "cuda"  # on a GPU the compiled step is the one users run
    task = progress.add_task("matmul peaks (fp32, bf16)", total=None)
    peak = peaks(device)
    progress.remove_task(task)
    measured = []
    for name in names:
        case = CASES[name]()
        settings = settings_for(case, device, compiled, peak.fast)
        task = progress.add_task(f"{name}: batches", total=None)
        data = batches(case, args.corpus, WARMUP + steps, device)
        progress.update(task, description=f"{name}: building {len(settings)} sides")
        sides = build_sides(case, settings, device, max_steps=WARMUP + steps)
        progress.update(task, description=f"{name}: {len(sides)} sides, one step each in turn", total=len(data))
        race(sides, data, WARMUP, partial(progress.advance, task))
        progress.update(task, description=f"{name}: FLOPs, activation memory, the matmul peaks again")
        peak = peak.best(peaks(device))  # another chance at a quiet moment on a shared machine
        speed = {s.name: tokens_per_s(s, data, WARMUP) for s in sides}
        for s in sides:
            s.activation_mb = activation_mb(s, data[0], device)
            eager = next(e for e in sides if e.name == s.name.split(" compiled")[0])  # same arithmetic
            s.flops = eager.flops if eager is not s else step_flops(s, data[WARMUP])
        progress.remove_task(task)
        measured.append((name, case, sides, speed))
    lines = [
        f"ablate vs transformers, training steps (forward, backward, AdamW) at the same configuration, "
        f"same weights and batches ({args.corpus}); {WARMUP} warm-up steps, then the median of {steps} "
        f"alternating steps. MFU: the step's FLOPs per second over this machine's measured matmul peak "
        f"in the side's precision.",
        "",
        f"- {peak.note()} (the best of {1 + len(names)} measurements: before the first case and after each)",
        "",
    ]
    all_ok = True
    for name, case, sides, speed in measured:
        block, ok = _block(name, case, sides, speed, peak, device)
        lines += block
        all_ok &= ok
    return lines, all_ok


def _describe(name: str, case: Case) -> str:
    """The case's heading: the architecture(s), sequence and batch, and the losses."""

    def arch(m: ModelConfig) -> str:
        intra = f" intra={m.intra_dim}" if m.intra_dim is not None else ""
        return (
            f"V={m.vocab_size} H={m.hidden_dim}{intra} E={m.embed_dim} L={m.num_layers} A={m.num_heads} "
            f"FFN={m.ffn_dim}x{m.num_ffn} sharing={m.sharing}"
        )

    shape = f"T={case.seq_len} B={case.batch}"
    if case.teacher is None:
        return f"### {name}: {arch(case.model)}, {shape}, MLM + {case.sentence.upper()}"
    return (
        f"### {name}: distillation, teacher {arch(case.teacher)} (forward) -> student {arch(case.model)} "
        f"(step), {shape}, MLM + {case.sentence.upper()} + KD + FMT + AT; transformers: eager attention "
        f"(its SDPA returns no attention probabilities, which AT needs)"
    )


def _fastest(sides: list[Side], speed: dict[str, float], library: str, precision: str | None = None) -> Side | None:
    """The fastest side of ``library`` (in ``precision``), compiled ones included; None when none ran."""
    mine = [s for s in sides if s.library == library and (precision is None or s.precision == precision)]
    return max(mine, key=lambda s: speed[s.name], default=None)


def _ratios(sides: list[Side], speed: dict[str, float]) -> dict[str, float]:
    """Every ratio a target can name (absent when the sides it needs did not run); transformers' best is its
    fastest side, compiled included."""

    def best(library: str, precision: str | None = None) -> float:
        return max(
            (speed[s.name] for s in sides if s.library == library and (precision is None or s.precision == precision)),
            default=float("nan"),
        )

    out = {
        "fp32": speed["ablate fp32"] / best("transformers", "fp32"),
        "best": best("ablate") / best("transformers"),
    }
    if any(s.precision == "bf16" for s in sides):
        out["bf16"] = best("ablate", "bf16") / speed["ablate fp32"]
    compiled = [v for k, v in speed.items() if k.startswith("ablate bf16 compiled")]
    if compiled:
        out["compiled"] = max(compiled) / speed["ablate bf16"]
    return out


def _block(
    name: str, case: Case, sides: list[Side], speed: dict[str, float], peak: Peaks, device: torch.device
) -> tuple[list[str], bool]:
    """The table of one case and its targets; True when every target holds."""
    hf_best = max(speed[s.name] for s in sides if s.library == "transformers")
    reference = next(s for s in sides if s.name == "ablate fp32")
    first_gap = max(abs(s.losses[0] - reference.losses[0]) for s in sides if s.precision == "fp32")
    lines = _table(name, case, sides, speed, hf_best, peak)
    ratios = _ratios(sides, speed)
    best_ours = max((s for s in sides if s.library == "ablate"), key=lambda s: speed[s.name])
    ratios["mfu"] = best_ours.flops / statistics.median(best_ours.times) / peak.flops[best_ours.precision]
    theirs = max((s for s in sides if s.library == "transformers"), key=lambda s: speed[s.name])
    labels = _labels(sides, speed, best_ours, theirs)
    targets, targets_ok = _target_lines(ratios, labels, dict(case.targets))
    ceiling = _ceiling(sides, best_ours, theirs, peak)
    same_start, same_ok = _same_start(first_gap, device)
    lines += ["", *targets, *ceiling, *same_start]
    return lines, targets_ok and same_ok


def _table(name: str, case: Case, sides: list[Side], speed: dict[str, float], hf_best: float, peak: Peaks) -> list[str]:
    """The case's heading and its table, a row per side, fastest first."""
    return [
        _describe(name, case),
        "",
        "| side | tokens/s | ms/step | x transformers best | GFLOP/step | TFLOP/s | MFU | activations MiB "
        "| first step s | loss step 1 | loss last step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(s, speed[s.name], hf_best, peak) for s in sorted(sides, key=lambda s: -speed[s.name])),
    ]


def _row(s: Side, speed: float, hf_best: float, peak: Peaks) -> str:
    """One side's row: ``speed`` its tokens/s, ``hf_best`` transformers' best tokens/s."""
    step_s = statistics.median(s.times)
    rate = s.flops / step_s
    mfu = rate / peak.flops[s.precision]
    # CUDA graphs keep activations in their own memory pool, which the allocator's peak does not see
    memory = "–" if s.name.endswith("cudagraphs") else f"{s.activation_mb:,.0f}"
    return (
        f"| {s.name} | {speed:,.0f} | {step_s * 1e3:.1f} | {speed / hf_best:.2f} | "
        f"{s.flops / 1e9:,.1f} | {rate / 1e12:.3f} | {mfu:.1%} | {memory} | "
        f"{s.first_s:.1f} | {s.losses[0]:.5f} | {s.losses[-1]:.4f} |"
    )


def _labels(sides: list[Side], speed: dict[str, float], best_ours: Side, theirs: Side) -> dict[str, str]:
    """What each ratio is (:func:`_ratios`' and ``mfu``), in the order the block lists them."""
    theirs_fp32 = _fastest(sides, speed, "transformers", "fp32")
    return {
        "fp32": f"ablate fp32 over transformers' best fp32 ({theirs_fp32.name if theirs_fp32 else '-'})",
        "best": f"ablate's best over transformers' best ({theirs.name})",
        "bf16": "ablate's best bf16 over its own fp32",
        "compiled": "ablate's best bf16 compiled over eager",
        "mfu": f"MFU of ablate's best ({best_ours.name})",
    }


def _target_lines(
    ratios: dict[str, float], labels: dict[str, str], targets: dict[str, float]
) -> tuple[list[str], bool]:
    """A line per ratio measured, with its target's verdict where the case sets one; True when every target holds."""
    lines: list[str] = []
    ok = True
    for key, label in labels.items():
        if key not in ratios:
            continue
        value = f"{ratios[key]:.1%}" if key == "mfu" else f"{ratios[key]:.2f}x"
        line = f"- {label}: **{value}**"
        if key in targets:
            met = ratios[key] >= targets[key]
            ok &= met
            goal = f"{targets[key]:.0%}" if key == "mfu" else f"{targets[key]}x"
            line += f" (target {goal}: {mark(met)})"
        lines.append(line)
    return lines, ok


def _ceiling(sides: list[Side], best_ours: Side, theirs: Side, peak: Peaks) -> list[str]:
    """How fast ablate's best step could be at the measured peak, and a warning when the peak reads low."""
    best_peak = peak.flops[best_ours.precision]
    floor_s = Ceiling(best_ours.flops, best_peak).min_step_s  # every FLOP at the peak, nothing else costing time
    lines = [
        f"- ceiling: at the {best_ours.precision} peak ablate's best step would take {floor_s * 1e3:.1f} ms against "
        f"{statistics.median(best_ours.times) * 1e3:.1f} ms now: best against best could reach at most "
        f"**{statistics.median(theirs.times) / floor_s:.2f}x**"
    ]
    if any(s.flops / statistics.median(s.times) > peak.flops[s.precision] for s in sides):
        lines.append(
            "- the measured peak is below what a step achieved: the machine was busy while it was measured "
            "(a shared machine), so MFU and the ceiling above are not to be read in this run"
        )
    return lines


def _same_start(first_gap: float, device: torch.device) -> tuple[list[str], bool]:
    """The fp32 sides' largest step-1 loss difference (``first_gap``) against the device's tolerance."""
    tolerance = SAME_START[device.type]
    ok = first_gap <= tolerance
    return [
        f"- same work: fp32 losses at step 1 differ by at most {first_gap:.1e} "
        f"({mark(ok)} at {tolerance:.0e}); last-step losses above",
        "",
    ], ok
