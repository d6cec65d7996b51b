"""``ablate bench loop``: does the whole training loop run at the speed of its own step? A real ``ablate
train`` of the ``--regime``'s run (:mod:`ablate.benchmarks.regimes`) against the same step alone, in
turns on a CPU, one block each on a GPU; the last line printed is ``loop efficiency: X.XX``
(docs/performance.md, "How bench loop measures")."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.progress import Progress

from ablate.benchmarks import mark
from ablate.benchmarks.cases import CASES, Case
from ablate.benchmarks.finetune_tasks import DEFAULT_TASK, check_task
from ablate.benchmarks.host_reads import ReadCount, Reads
from ablate.benchmarks.loop_clock import Alone, StepClock, Timing, turn_cpu_gaps, turn_gaps, turn_ratios
from ablate.benchmarks.loop_floor import STEPS as FLOOR_STEPS
from ablate.benchmarks.loop_floor import Floor, lightning_floor
from ablate.benchmarks.regimes import DEFAULT_CASE, FINETUNE_BATCH, Setup, TaskChoice, check_case, setup
from ablate.lightning_modules.config.experiment import DataConfig, ExperimentConfig, ObjectiveConfig
from ablate.lightning_modules.config.run import TrackingConfig, TrainerConfig
from ablate.sweeps.engine.context import RunContext

TARGET = 0.90
HOST_TARGET_MS = 1.0  # the loop's host time per step that a GPU cannot hide (issue 42), read at the micro case
WARMUP = {"cpu": 5, "cuda": 30}  # steps before the steady state: compilation and CUDA graph recording, workers starting
STEPS = {"cpu": 40, "cuda": 300}
BLOCK = {"cpu": 1, "cuda": None}  # steps per turn; None: the step alone after the run
READ_STEPS = 30  # steady steps of the run whose device reads are counted (three log steps at the default)


def run_config(
    case: Case, corpus: str, device: torch.device, steps: int, root: str, compiled: bool | None = None
) -> ExperimentConfig:
    """The ``ablate train`` config of ``case``: bf16, compiled with CUDA graphs on a GPU; fp32 eager
    on a CPU (its fastest setting there, as ``ablate bench train`` shows); ``compiled`` says otherwise."""
    cuda = device.type == "cuda"
    compiled = cuda if compiled is None else compiled
    return ExperimentConfig(
        name=f"bench-loop-{case.name}",
        model=case.model,
        objective=ObjectiveConfig(sentence=case.sentence, mask_prob=case.mask_prob),
        data=DataConfig(corpus=corpus, max_length=case.seq_len, batch_size=case.batch, tokenizer_docs=5000),
        trainer=TrainerConfig(
            max_steps=steps,
            val_every=steps,
            val_batches=5,
            accelerator=device.type,
            precision="bf16-mixed" if cuda else "32-true",
            compile=compiled,
            compile_mode="reduce-overhead" if cuda and compiled else "default",
        ),
        tracking=TrackingConfig(root=root, experiment="bench-loop"),
    )


@dataclass
class LoopResult:
    """One ``ablate bench loop`` measurement: the two speeds and the run's wall-time phases (s)."""

    case: Case
    cfg: ExperimentConfig
    regime: str
    what: str
    loader: str
    warmup: int
    steps: int
    block: int | None
    loop: Timing
    step: Timing
    phases: dict[str, float]
    load: tuple[float, float]  # 1-minute load average before and after
    after: list[str] = field(default_factory=list)  # the regime's own measurement (fine-tuning: padding)
    reads: Reads | None = None  # the host's reads of device values, from a short counted run

    @property
    def by_median(self) -> float:
        """The loop's tokens/s over the step alone's, each over its median step time."""
        return self.loop.tokens_per_s / self.step.tokens_per_s

    @property
    def host_ms(self) -> float:
        """The host time the loop adds to each step (ms): the median turn's loop step less its step alone;
        after the run (a GPU), the difference of the two sides' median step times."""
        gaps = turn_gaps(self.loop, self.step)
        if len(gaps) >= 3:
            return 1e3 * statistics.median(gaps)
        return 1e3 * (self.loop.median_step_s - self.step.median_step_s)

    @property
    def host_mean_ms(self) -> float:
        """The same averaged over every turn, its log steps' included (what a run pays per step)."""
        gaps = turn_gaps(self.loop, self.step)
        if len(gaps) >= 3:
            return 1e3 * statistics.fmean(gaps)
        return 1e3 * (self.loop.seconds / self.loop.steps - self.step.seconds / self.step.steps)

    @property
    def host_cpu_ms(self) -> float | None:
        """The loop's own work per step (ms): the median turn's main-thread CPU time per step less the step
        alone's (None unless they ran in turns); the machine's other processes do not inflate it."""
        gaps = turn_cpu_gaps(self.loop, self.step)
        return 1e3 * statistics.median(gaps) if len(gaps) >= 3 else None

    @property
    def efficiency(self) -> float:
        """The median turn's ratio of the two rates when they ran in turns (a shared machine's load
        changes from second to second: the two halves of a turn see the same); else :attr:`by_median`."""
        ratios = turn_ratios(self.loop, self.step)
        return statistics.median(ratios) if len(ratios) >= 3 else self.by_median


def _alone_built(s: Setup, device: torch.device, warmup: int, steps: int) -> Alone:
    """The step alone of ``s`` on its own batches (one per step of the run, at most 400), warmed up."""
    step, data = s.step(min(warmup + steps, 400))
    alone = Alone(step, data, device)
    alone.warm_up(warmup)
    return alone


def _loop_and_step(
    s: Setup,
    device: torch.device,
    warmup: int,
    steps: int,
    block: int | None,
    progress: Callable[[str], None],
    regime: str,
) -> tuple[Timing, Timing, dict[str, float]]:
    """Time ``ablate train`` of ``s`` and its step alone (in turns of ``block`` steps inside the run, or
    after it when None): the loop's timing, the step alone's, and the run's phases (:func:`_timed_run`)."""
    alone = None
    if block is not None:
        progress(f"{regime}: the step alone, batches and warm-up")
        alone = _alone_built(s, device, warmup, steps)
    turns = f", the step alone in turns of {block}" if block else ""
    progress(f"{regime}: ablate train, {warmup + steps} steps{turns}")
    clock = StepClock(warmup, steps, device, block, alone)
    phases = _timed_run(s, clock)
    if alone is None:
        progress(f"{regime}: the step alone")
        alone = _alone_built(s, device, warmup, steps)
        alone.run(clock.timing.steps)
    return clock.timing, alone.timing, phases


def _regime_after(s: Setup, progress: Callable[[str], None], regime: str) -> list[str]:
    """The regime's own measurement after the run (fine-tuning: padding), its table lines; none without one."""
    if s.after is None:
        return []
    progress(f"{regime}: padding to the longest row against max_length")
    return s.after()


def measure(
    case: Case,
    corpus: str,
    device: torch.device,
    warmup: int,
    steps: int,
    block: int | None,
    progress: Callable[[str], None] = lambda _: None,
    regime: str = "pretrain",
    choice: TaskChoice = TaskChoice(),  # noqa: B008 - frozen
    compiled: bool | None = None,
) -> LoopResult:
    """Run ``ablate train`` of ``regime`` for ``warmup + steps`` steps and the step alone for the
    same steady-state count (in turns of ``block`` steps inside the run, or after it when None);
    ``compiled``: as :func:`run_config` says."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ablate-bench-loop-") as root:
        progress(f"{regime}: the run's models and data")
        cfg = run_config(case, corpus, device, warmup + steps, root, compiled)
        s = setup(regime, case, cfg, corpus, device, Path(root), choice)
        loop, step, phases = _loop_and_step(s, device, warmup, steps, block, progress, regime)
        after = _regime_after(s, progress, regime)
        progress(f"{regime}: device reads, counted in a run of {warmup + READ_STEPS} steps")
        reads = counted_reads(s, device, warmup)
    if not loop.blocks or not loop.tokens:
        raise RuntimeError("the run ended before its steady state")
    return LoopResult(
        case,
        s.cfg,
        regime,
        s.what,
        s.loader,
        warmup,
        steps,
        block,
        loop,
        step,
        phases,
        (load_before, os.getloadavg()[0]),
        after,
        reads,
    )


def counted_reads(s: Setup, device: torch.device, warmup: int) -> Reads:
    """The host's reads of device values in a run of ``s`` stopped after ``warmup`` + :data:`READ_STEPS`
    steps (counting slows the host, so it is not the timed run; eager, as counting sees only Python)."""
    count = ReadCount(device, warmup, READ_STEPS)
    eager = torch.compiler.set_stance("force_eager") if device.type == "cpu" else contextlib.nullcontext()
    with eager, contextlib.redirect_stdout(sys.stderr):
        s.run(RunContext(callbacks=(count,)))
    return count.reads


def _timed_run(s: Setup, clock: StepClock) -> dict[str, float]:
    """Run ``ablate train`` of ``s`` with ``clock`` in it; the seconds each of its phases took (the
    step alone's turns inside the run left out of them, and said apart)."""
    stamps: dict[str, float] = {}
    begin = time.perf_counter()

    # the run's own progress bar goes to stderr with the bench's status: stdout keeps the tables
    def timed(what: str, start: float, end: float) -> None:
        stamps[f"{what}_start"], stamps[f"{what}_end"] = start, end

    with contextlib.redirect_stdout(sys.stderr):
        s.run(RunContext(callbacks=(clock,), timed=timed))
    end = time.perf_counter()
    first, last = clock.ends[0], clock.ends[-1]
    measure_start, measure_end = stamps.get("measure_start", begin), stamps.get("measure_end", begin)
    return {
        "data, tokenizer, model": measure_start - begin,
        "measurement": measure_end - measure_start,
        "run and Trainer": clock.fit_start - measure_end,
        "first step": first - clock.fit_start,
        "training": last - first - clock.in_run_alone_s,
        "validation": clock.validation_s,
        "teardown": end - last - clock.validation_s,
        "total": end - begin - clock.in_run_alone_s,
        "step alone in the run": clock.in_run_alone_s,
    }


def _estimates(r: LoopResult) -> list[str]:
    """How the efficiency reads by each estimate: turn by turn (its spread says how much of a gap is
    the machine's noise), over the two median step times (the table's tokens/s), over the mean ones."""
    ratios = sorted(turn_ratios(r.loop, r.step))
    by_mean = r.loop.mean_tokens_per_s / r.step.mean_tokens_per_s
    if len(ratios) < 3:
        return [f"- over the mean step times (log steps included): {by_mean:.2f}"]
    q = statistics.quantiles(ratios, n=10)
    return [
        f"- loop efficiency turn by turn (one step of each on the same batch, one after the other): the median "
        f"of {len(ratios)} turns' ratios, {statistics.median(ratios):.2f} "
        f"(10th-90th percentile {q[0]:.2f}-{q[-1]:.2f})",
        f"- over the two sides' median step times (the table): {r.by_median:.2f}; over their mean step times "
        f"(log steps included): {by_mean:.2f}",
    ]


def _host_lines(r: LoopResult, floor: Floor | None) -> list[str]:
    """The host time per step; the main thread's CPU time of it, when the two sides ran in turns; how
    much of it Lightning's bare loop takes (``floor``, timed in the same process), and what is ablate's."""
    lines = [
        f"- host time per step: {r.host_ms:.2f} ms, the loop's step less the step alone's (the median turn's; "
        f"target <= {HOST_TARGET_MS} ms at the micro case); {r.host_mean_ms:.2f} ms averaged over every turn, "
        f"the log steps' (every {r.cfg.trainer.log_every}) included"
    ]
    cpu = r.host_cpu_ms
    if cpu is not None:
        lines.append(
            f"- of it, the loop's own work: {cpu:.2f} ms of the main thread's CPU time (the median turn's, the loop's "
            f"less the step alone's; the rest is waiting: the loader, other threads and processes)"
        )
    if floor is not None:
        lines.append(
            f"- of it, Lightning's own loop at its barest: {floor.host_ms:.2f} ms (a Trainer.fit of one linear layer "
            f"on batches in memory, no callbacks, logger or progress bar: {floor.loop_ms:.2f} ms a step against "
            f"{floor.step_ms:.2f} by hand, in this process); ablate's loop adds {r.host_ms - floor.host_ms:.2f} ms"
        )
    return lines


def report(r: LoopResult, corpus: str, floor: Floor | None = None) -> tuple[list[str], bool]:
    """The tables and the last line, ``loop efficiency: X.XX``; whether the target holds. ``floor``:
    Lightning's bare loop, to say what of the host time is ablate's."""
    t, p = r.cfg.trainer, r.phases
    how = f"in turns of {r.block} step{'s' if r.block > 1 else ''} inside the run" if r.block else "after the run"
    data = "" if r.regime == "finetune" else f", T={r.case.seq_len} B={r.case.batch}, {corpus}"
    task = f" --task {r.cfg.finetune.task}" if r.regime == "finetune" else ""
    lines = [
        f"### {r.case.name}: ablate train --regime {r.regime}{task} ({r.what}; {t.precision}"
        f"{', compiled ' + t.compile_mode if t.compile else ''}, {r.loader}{data}) against its isolated step "
        f"({how}); steady state = steps {r.warmup + 2} to {r.warmup + r.steps}",
        "",
        "| | tokens/s | ms/step (median) | ms/step (mean) | steps timed |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {what} | {x.tokens_per_s:,.0f} | {1e3 * x.median_step_s:.1f} | {1e3 * x.seconds / x.steps:.1f} | "
            f"{x.steps} |"
            for what, x in (("the loop (ablate train)", r.loop), ("the step alone", r.step))
        ),
        "",
        "| wall time of the run | s |",
        "|---|---:|",
        f"| start-up: corpus check, tokenizer, model | {p['data, tokenizer, model']:.1f} |",
        f"| start-up: measurement (parameters, FLOPs, latency and memory probes) | {p['measurement']:.1f} |",
        f"| start-up: MLflow run, Trainer | {p['run and Trainer']:.1f} |",
        f"| start-up: loader workers, first batch, first step{' (compilation)' if t.compile else ''} | "
        f"{p['first step']:.1f} |",
        f"| training ({t.max_steps - 1} steps after the first) | {p['training']:.1f} |",
        f"| validation ({'the dev set' if r.regime == 'finetune' else f'{t.val_batches} batches'}) | "
        f"{p['validation']:.1f} |",
        f"| teardown (end of fit, workers stopping, logging the weights, closing the run) | {p['teardown']:.1f} |",
        f"| total | {p['total']:.1f} |",
    ]
    if r.block:
        lines.append(f"| (not in the run: the step alone's turns, {p['step alone in the run']:.1f} s) | |")
    lines += r.after
    lines += [
        "",
        f"- machine load (1-minute average) {r.load[0]:.2f} before, {r.load[1]:.2f} after",
        *_estimates(r),
        *_host_lines(r, floor),
        *(r.reads.lines() if r.reads is not None else []),
        f"- target: loop efficiency >= {TARGET} ({mark(r.efficiency >= TARGET)})",
        "",
        f"loop efficiency: {r.efficiency:.2f}",
    ]
    return lines, r.efficiency >= TARGET


def chosen(args: argparse.Namespace, device: torch.device) -> tuple[str, Case]:
    """The regime and case ``args`` name (a regime's default case: the GPU-sized one on CUDA),
    checked to fit each other (ConfigError, ``--case``) and, for fine-tuning, the task's data to be
    reachable (``--task``) before anything runs."""
    regime = args.regime or "pretrain"
    name = (args.case or [DEFAULT_CASE["cuda" if device.type == "cuda" else "cpu"][regime]])[0]
    case = CASES[name]()
    check_case(regime, case)
    if regime == "finetune":
        check_task(args.task or DEFAULT_TASK)
    return regime, case


def sides(regime: str, device: torch.device, compile_too: bool) -> list[bool | None]:
    """The runs timed: fine-tuning eagerly, then compiled as a study on a GPU runs it (bucketed widths, CUDA
    graphs; on a CPU only with ``--compile``), the last line the compiled one's; the others at one setting."""
    if regime != "finetune":
        return [None]
    return [False, True] if device.type == "cuda" or compile_too else [False]


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    regime, case = chosen(args, device)
    name = case.name
    warmup, steps = WARMUP[device.type], args.steps or STEPS[device.type]
    choice = TaskChoice(args.task or DEFAULT_TASK, args.sst2, args.batch or FINETUNE_BATCH)
    lines: list[str] = []
    ok = True
    bar = progress.add_task(name, total=None)
    floor = None
    if device.type == "cpu":  # the host time a GPU cannot hide shows on the CPU; Lightning's share of it
        progress.update(bar, description=f"{name}: Lightning's bare loop, {FLOOR_STEPS} steps")
        floor = lightning_floor(FLOOR_STEPS)
    for compiled in sides(regime, device, args.compile):
        result = measure(
            case,
            args.corpus,
            device,
            warmup,
            steps,
            BLOCK[device.type],
            lambda what: progress.update(bar, description=f"{name}: {what}"),
            regime,
            choice,
            compiled,
        )
        table, met = report(result, args.corpus, floor)
        lines += [*([""] if lines else []), *table]
        ok = ok and met
    progress.remove_task(bar)
    return lines, ok
