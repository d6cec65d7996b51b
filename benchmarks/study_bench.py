"""``ablate bench study STUDY.yaml``: where a study's time goes. The study runs as ``ablate sweep`` runs
it (``--smoke``: its smoke form) in a temporary store, with clocks in every run (``run_study``'s
``hooks``, :class:`StudyClock`); each run's wall time cut into :data:`PARTS` (after its steps:
:data:`AFTER`), the fixed cost of a repeat run and the study's efficiency (docs/performance.md,
"Where a study's time goes")."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import lightning.pytorch as pl
import torch
from rich.progress import Progress

if TYPE_CHECKING:
    from ablate.sweeps.base import StudyBase
    from ablate.sweeps.engine.interrupt import Interrupted
    from ablate.sweeps.spec import StudySpec

WARMUP = 3
"""Steps of a run left out of its steady state (compilation, the loader's start), fewer in a short run."""
END_OF_FIT = "end of fit"
PHASE_END = "phase checkpoint"
CLOSING = "closing the run"
AFTER = "after the steps"
"""The part after a run's last step, by part (:attr:`RunTime.after`): the end of its last fit (up to
Lightning's ``on_fit_end``; its last validation left out), the phase's end after it (its
``phase-<k>.ckpt``, what it hands on: a fine-tuning run's best weights restored), each finisher up to
the next one's start (``finisher:<name>`` stamps), closing the run after the last."""
PARTS = (
    "data, tokenizer",
    "measurement",
    "MLflow run, Trainer",
    "first step",
    "training",
    "validation",
    "between phases",
    AFTER,
)
"""A run's wall time, part by part, in the order they happen: start-up (data, corpus check and tokenizer
up to the measurement, or up to the first fit in a run without one; the parameter, FLOP, latency and
memory measurement; the MLflow run and the Trainer; the first step), training (the steps after the
first), validation (wherever it falls), between phases (a multi-phase run's later fits starting) and
after the steps."""
FINISHER = "finisher:"


@dataclass
class Fit:
    """One Trainer's fit: its run, its start, every training batch's end and its end."""

    run_id: str
    start: float
    ends: list[float] = field(default_factory=list)
    end: float = 0.0

    @property
    def first(self) -> float:
        return self.ends[0] if self.ends else (self.end or self.start)

    @property
    def last(self) -> float:
        return self.ends[-1] if self.ends else (self.end or self.start)


class StudyClock(pl.Callback):
    """One callback in every Trainer of every run of the study: each fit (its run's MLflow id, from the
    Trainer's logger), every training batch's end, each validation (fits' and ``trainer.validate``'s)."""

    def __init__(self) -> None:
        self.fits: list[Fit] = []
        self.validations: list[tuple[float, float]] = []
        self._val_start = 0.0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.fits.append(Fit(str(getattr(trainer.logger, "run_id", "") or ""), time.perf_counter()))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)  # the step's end, not its launch
        if self.fits:
            self.fits[-1].ends.append(time.perf_counter())

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.fits:
            self.fits[-1].end = time.perf_counter()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.validations.append((self._val_start, time.perf_counter()))


@dataclass
class RunTime:
    """One run of the study: its name, kind (regime, task, model shape), parts of its wall time
    (:data:`PARTS`, seconds), the part after its steps by part (:data:`AFTER`), steps and steady-state
    step time."""

    name: str
    kind: str
    parts: dict[str, float]
    after: dict[str, float]
    wall: float
    steps: int
    step_s: float

    @property
    def fixed(self) -> float:
        """What the run costs besides its steps and validation: start-up, between phases, after the steps."""
        return self.wall - self.parts["training"] - self.parts["validation"]


def _overlap(a: float, b: float, spans: Iterable[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)


def _steady_step(fits: list[Fit], validations: list[tuple[float, float]]) -> float:
    """The median step time after the first :data:`WARMUP` steps (steps with a validation in them left out)."""
    gaps = [e - s for f in fits for s, e in zip(f.ends, f.ends[1:], strict=False) if _overlap(s, e, validations) == 0.0]
    if not gaps:  # a one-step run: its only step
        return fits[0].first - fits[0].start if fits else 0.0
    return statistics.median(gaps[min(WARMUP, len(gaps) // 2) :])


Cut = tuple[str, float, float]
"""A part of a run's timeline: its name, start and end."""


def _steps(span: tuple[float, float], measure: tuple[float, float] | None, fits: list[Fit], end: float) -> list[Cut]:
    """The run's timeline from its start to ``end`` (its last step's, or where its finishers start in a
    run without a fit), cut into :data:`PARTS` before :data:`AFTER`."""
    a = span[0]
    if not fits:  # a run that evaluates what it is given (the quant regime's float arm)
        m0, m1 = measure or (a, a)
        return [("data, tokenizer", a, m0), ("measurement", m0, m1), ("MLflow run, Trainer", m1, end)]
    m0, m1 = measure or (fits[0].start, fits[0].start)
    cuts = [
        ("data, tokenizer", a, m0),
        ("measurement", m0, m1),
        ("MLflow run, Trainer", m1, fits[0].start),
        ("first step", fits[0].start, fits[0].first),
    ]
    for before, fit in zip([None, *fits], fits, strict=False):
        if before is not None:
            cuts.append(("between phases", before.last, fit.first))
        cuts.append(("training", fit.first, fit.last))
    return cuts


def _after(last: float, fit_end: float, finishers: list[Cut], b: float) -> list[Cut]:
    """The run's timeline from its last step (``last``; its fit ended at ``fit_end``) to its end ``b``,
    cut into :data:`AFTER`'s parts."""
    first = finishers[0][1] if finishers else b
    fit_end = min(max(fit_end, last), first)  # an unended fit: none
    cuts = [(END_OF_FIT, last, fit_end), (PHASE_END, fit_end, first)]
    if not finishers:
        return [*cuts, (CLOSING, b, b)]
    starts = [s for _, s, _ in finishers[1:]]
    cuts += [(name, s, end) for (name, s, _), end in zip(finishers, [*starts, finishers[-1][2]], strict=True)]
    return [*cuts, (CLOSING, finishers[-1][2], b)]


def run_time(
    span: tuple[float, float],
    measure: tuple[float, float] | None,
    fits: list[Fit],
    validations: list[tuple[float, float]],
    finishers: list[Cut],
    name: str,
    kind: str,
) -> RunTime:
    """The parts of the run that lasted ``span`` (each point of its timeline in order, so that they add up
    to its wall time; validation taken out of the part it fell in); ``finishers``: its finishers' names
    and spans, in order."""
    a, b = span
    last = fits[-1].last if fits else (finishers[0][1] if finishers else b)
    mine = [(max(s, a), min(e, b)) for s, e in validations if e > a and s < b]
    parts = dict.fromkeys(PARTS, 0.0)
    for what, s, e in _steps(span, measure, fits, last):
        parts[what] += e - s - _overlap(s, e, mine)
    after: dict[str, float] = {}
    for what, s, e in _after(last, fits[-1].end if fits else last, finishers, b):
        after[what] = after.get(what, 0.0) + e - s - _overlap(s, e, mine)
    parts[AFTER] = sum(after.values())
    parts["validation"] = sum(e - s for s, e in mine)
    steps = sum(len(f.ends) for f in fits)
    return RunTime(name, kind, parts, after, b - a, steps, _steady_step(fits, mine))


@dataclass
class StudyTime:
    """The study's runs, its wall time and what the bench ran."""

    study: str
    runs: list[RunTime]
    wall: float
    what: str
    load: tuple[float, float]  # the 1-minute load average before and after
    stopped: Interrupted | None = None  # the signal that ended the study early: the runs that ended before it

    @property
    def efficiency(self) -> float:
        """The runs' steady-state step time times their steps, over the study's wall time."""
        return sum(r.step_s * r.steps for r in self.runs) / self.wall

    def repeats(self) -> tuple[list[RunTime], str]:
        """The runs after the first of their kind; where there are none, the runs after the first."""
        seen: set[str] = set()
        again = []
        for r in self.runs:
            if r.kind in seen:
                again.append(r)
            seen.add(r.kind)
        if again:
            return again, "the runs after the first of their kind (regime, task, model shape)"
        return self.runs[1:], "no two runs are of one kind: the runs after the study's first"

    @property
    def repeat_cost(self) -> float:
        runs, _ = self.repeats()
        return statistics.mean(r.fixed for r in runs) if runs else float("nan")

    def after_parts(self) -> list[str]:
        """The parts after the steps that occurred, each run's in its order (end of fit first, closing last)."""
        order: list[str] = []
        for r in self.runs:
            at = 0
            for what in r.after:
                if what in order:
                    at = order.index(what) + 1
                else:
                    order.insert(at, what)
                    at += 1
        return order


def _kind(params: dict[str, str]) -> str:
    """A run's kind: its regime, its task (a fine-tuning run's) and every ``model.*`` param."""
    keys = [k for k in params if k.startswith("model.") or k in ("regime", "finetune.task")]
    return repr(sorted((k, params[k]) for k in keys))


def runs_of(stamps: list[tuple[str, float, float]], clock: StudyClock, uri: str) -> list[RunTime]:
    """Every run the clocks heard (``stamps``: what the ``timed`` hook heard, ``(what, start, end)``), in
    the order they started, named and kinded from the MLflow run of its first fit (``run <i>`` without one)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = []
    for i, (a, b) in enumerate(sorted((s, e) for what, s, e in stamps if what == "run")):
        measured = [(s, e) for what, s, e in stamps if what == "measure" and a <= s <= b]
        ended = sorted((s, e, what) for what, s, e in stamps if what.startswith(FINISHER) and a <= s <= b)
        finishers = [(what.removeprefix(FINISHER), s, e) for s, e, what in ended]
        fits = [f for f in clock.fits if a <= f.start <= b]
        name, kind = f"run {i + 1}", f"run {i + 1}"
        if fits and fits[0].run_id:
            got = client.get_run(fits[0].run_id)
            name, kind = got.info.run_name or name, _kind(got.data.params)
        runs.append(run_time((a, b), measured[0] if measured else None, fits, clock.validations, finishers, name, kind))
    return runs


def measure_study(
    spec: StudySpec, base: StudyBase, where: str, smoke: bool, progress: Callable[[str], None] = lambda _: None
) -> StudyTime:
    """Run the study (its smoke form with ``smoke``) in a temporary store with the clocks in every run."""
    from ablate.sweeps.checks import Machine, check_study
    from ablate.sweeps.engine.context import RunContext
    from ablate.sweeps.engine.interrupt import Interrupted
    from ablate.sweeps.smoke import smoke_study
    from ablate.sweeps.study import run_study

    with tempfile.TemporaryDirectory(prefix="ablate-bench-study-") as tmp:
        root = Path(tmp)
        if smoke:
            spec, base = smoke_study(spec, base, root, where)
        else:
            base = base.changed({"tracking.root": str(root)})
        check_study(spec, base, where, Machine.here())
        clock, stamps = StudyClock(), []

        def timed(what: str, start: float, end: float) -> None:
            stamps.append((what, start, end))

        uri = f"sqlite:///{root / 'mlflow.db'}"
        progress(f"{spec.name}: {spec.total_trials()} trials{' (smoke)' * smoke}")
        load, begin = os.getloadavg()[0], time.perf_counter()
        stopped = None
        with contextlib.redirect_stdout(sys.stderr):  # the runs' own lines go with the bench's status
            try:
                run_study(
                    spec,
                    base,
                    storage=f"sqlite:///{root / 'optuna.db'}",
                    tracking_uri=uri,
                    where=where,
                    hooks=RunContext(clocks=(clock,), timed=timed),
                )
            except Interrupted as stop:  # a time limit's SIGTERM: still the table of the runs that ended
                stopped = stop
        wall = time.perf_counter() - begin
        runs = runs_of(stamps, clock, uri)
    what = "smoke form" if smoke else "as written"
    return StudyTime(spec.name, runs, wall, what, (load, os.getloadavg()[0]), stopped)


def cell(text: str) -> str:
    """``text`` as one markdown table cell: its ``|`` escaped (a chained stage's ``trial | task`` name)."""
    return text.replace("|", "\\|")


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def after_table(t: StudyTime) -> list[str]:
    """The part after the steps, by part: a row per run and their sum, adding up to its :data:`AFTER`."""
    cols = t.after_parts()

    def row(name: str, after: dict[str, float], total: float) -> str:
        return _row([name, *(f"{after.get(c, 0.0):.2f}" for c in cols), f"{total:.2f}"])

    summed = {c: sum(r.after.get(c, 0.0) for r in t.runs) for c in cols}
    return [
        "after the last step, by part (s): end of fit (its last validation left out), the phase's checkpoint and "
        "what it hands on, each finisher, closing the run",
        "",
        _row(["run", *cols, AFTER]),
        "|---|" + "---:|" * (len(cols) + 1),
        *(row(cell(r.name), r.after, r.parts[AFTER]) for r in t.runs),
        row("**all runs**", summed, sum(r.parts[AFTER] for r in t.runs)),
    ]


def report(t: StudyTime) -> list[str]:
    """The table (a row per run, their sum), the part after the steps by part, and the last line."""
    head = ["run", *PARTS, "wall", "steps", "ms/step (steady)"]

    def row(name: str, parts: dict[str, float], wall: float, steps: int, step: str) -> str:
        return _row([name, *(f"{parts[p]:.2f}" for p in PARTS), f"{wall:.2f}", str(steps), step])

    summed = {p: sum(r.parts[p] for r in t.runs) for p in PARTS}
    in_runs = sum(r.wall for r in t.runs)
    repeats, which = t.repeats()
    steady = sum(r.step_s * r.steps for r in t.runs)
    blank = " | " * (len(PARTS) - 1)
    return [
        f"### study {t.study} ({t.what}): {len(t.runs)} runs, wall time by part (s)"
        + (f"; interrupted by {t.stopped.name} after {t.wall:.1f} s: the runs that ended" if t.stopped else ""),
        "",
        _row(head),
        "|---|" + "---:|" * (len(head) - 1),
        *(row(cell(r.name), r.parts, r.wall, r.steps, f"{1e3 * r.step_s:.1f}") for r in t.runs),
        row("**all runs**", summed, in_runs, sum(r.steps for r in t.runs), ""),
        f"| study outside its runs (preflight, stores, parent run) | {blank} | {t.wall - in_runs:.2f} | | |",
        f"| **study** | {blank} | {t.wall:.2f} | | |",
        "",
        *after_table(t),
        "",
        f"- machine load (1-minute average) {t.load[0]:.2f} before, {t.load[1]:.2f} after",
        f"- steady-state step time: each run's median step after its first {WARMUP} (fewer in a short run); "
        f"steps x that time, summed: {steady:.1f} s of the study's {t.wall:.1f} s",
        f"- fixed cost of a repeat run (wall less training and validation), {which}: "
        f"{', '.join(f'{r.fixed:.1f}' for r in repeats) or 'none'} s",
        "",
        f"fixed cost of a repeat run: {t.repeat_cost:.1f} s; study efficiency: {t.efficiency:.2f}"
        if t.runs
        else "no run ended",
    ]


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    from ablate.sweeps.spec import load_study, validate_study

    where = str(args.study)  # given, and checked to be a study, by the command (ablate.commands)
    spec, base = load_study(where)
    if args.device != "auto":  # else each run's own trainer.accelerator
        base = base.changed({"trainer.accelerator": device.type})
        validate_study(spec, base, where)
    bar = progress.add_task(spec.name, total=None)
    result = measure_study(spec, base, where, args.smoke, lambda what: progress.update(bar, description=what))
    progress.remove_task(bar)
    if result.stopped is not None:  # the table now, before the interruption's line and exit status
        print("\n".join(report(result)), flush=True)
        raise result.stopped
    return report(result), True
