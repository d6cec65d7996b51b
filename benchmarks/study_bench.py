"""``ablate bench study STUDY.yaml``: where a study's time goes.

The study runs as ``ablate sweep`` runs it (:func:`ablate.sweeps.study.run_study`; with ``--smoke``, its
smoke form, :func:`ablate.sweeps.smoke.smoke_study`), in a temporary MLflow and Optuna store that is
deleted after (the user's store is untouched; the tokenizer and data caches are the study's own), with
clocks in every run it starts (``run_study``'s ``hooks``): a ``timed`` hook that hears each run's start
and end and its measurement, and one Lightning callback (:class:`StudyClock`) in every phase's Trainer
that stamps each fit's start, every training batch's end (after a device sync on a GPU) and each
validation.

Each run's wall time is cut at those stamps into parts that add up to it: start-up (data, corpus check
and tokenizer up to the measurement; the parameter, FLOP, latency and memory measurement; the MLflow run
and the Trainer; the first step), training (the steps after the first), validation (wherever it falls),
between phases (a multi-phase run's later fits starting) and teardown (after the last step: the end of
fit, finishers, logging the weights, closing the run). A run's steady-state step time is the median of
its step times after the first :data:`WARMUP`; the study's efficiency is the sum over its runs of that
step time times the run's steps, over the study's wall time (from ``run_study``'s call to its return:
the study's own preflight and stores included). The fixed cost of a repeat run is the wall time less
training and validation of the runs after the first of their model shape (every ``model.*`` param
equal), averaged; where no two runs share a shape, of the runs after the study's first.
"""

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
from typing import Any

import lightning.pytorch as pl
import torch
from rich.progress import Progress

from ablate.lightning_modules.config.load import set_dotted

WARMUP = 3
"""Steps of a run left out of its steady state (compilation, the loader's start), fewer in a short run."""
PARTS = (
    "data, tokenizer",
    "measurement",
    "MLflow run, Trainer",
    "first step",
    "training",
    "validation",
    "between phases",
    "teardown",
)
"""A run's wall time, part by part, in the order they happen (validation: wherever it falls)."""


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
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
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
    """One run of the study: its name, model shape, parts of its wall time (:data:`PARTS`, seconds),
    steps and steady-state step time."""

    name: str
    shape: str
    parts: dict[str, float]
    wall: float
    steps: int
    step_s: float

    @property
    def fixed(self) -> float:
        """What the run costs besides its steps and validation: start-up, between phases, teardown."""
        return self.wall - self.parts["training"] - self.parts["validation"]


def _overlap(a: float, b: float, spans: Iterable[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)


def _steady_step(fits: list[Fit], validations: list[tuple[float, float]]) -> float:
    """The median step time after the first :data:`WARMUP` steps (steps with a validation in them left out)."""
    gaps = [e - s for f in fits for s, e in zip(f.ends, f.ends[1:], strict=False) if _overlap(s, e, validations) == 0.0]
    if not gaps:  # a one-step run: its only step
        return fits[0].first - fits[0].start if fits else 0.0
    return statistics.median(gaps[min(WARMUP, len(gaps) // 2) :])


def run_time(
    span: tuple[float, float],
    measure: tuple[float, float] | None,
    fits: list[Fit],
    validations: list[tuple[float, float]],
    name: str,
    shape: str,
) -> RunTime:
    """The parts of the run that lasted ``span`` (each point of its timeline in order, so that they add up
    to its wall time; validation taken out of the part it fell in)."""
    a, b = span
    if not fits:  # no Trainer with the clock (a chained trial's fine-tuning stage): start-up and teardown
        m0, m1 = measure or (a, a)
        cuts = [("data, tokenizer", a, m0), ("measurement", m0, m1), ("teardown", m1, b)]
    else:
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
        cuts.append(("teardown", fits[-1].last, b))
    mine = [(max(s, a), min(e, b)) for s, e in validations if e > a and s < b]
    parts = dict.fromkeys(PARTS, 0.0)
    for what, s, e in cuts:
        parts[what] += e - s - _overlap(s, e, mine)
    parts["validation"] = sum(e - s for s, e in mine)
    steps = sum(len(f.ends) for f in fits)
    return RunTime(name, shape, parts, b - a, steps, _steady_step(fits, mine))


@dataclass
class StudyTime:
    """The study's runs, its wall time and what the bench ran."""

    study: str
    runs: list[RunTime]
    wall: float
    what: str
    load: tuple[float, float]  # the 1-minute load average before and after

    @property
    def efficiency(self) -> float:
        """The runs' steady-state step time times their steps, over the study's wall time."""
        return sum(r.step_s * r.steps for r in self.runs) / self.wall

    def repeats(self) -> tuple[list[RunTime], str]:
        """The runs after the first of their model shape; where there are none, the runs after the first."""
        seen: set[str] = set()
        again = []
        for r in self.runs:
            if r.shape in seen:
                again.append(r)
            seen.add(r.shape)
        if again:
            return again, "the runs after the first of their model shape"
        return self.runs[1:], "no two runs share a model shape: the runs after the study's first"

    @property
    def repeat_cost(self) -> float:
        runs, _ = self.repeats()
        return statistics.mean(r.fixed for r in runs) if runs else float("nan")


def measure_study(
    spec: Any, base: dict[str, Any], where: str, smoke: bool, progress: Callable[[str], None] = lambda _: None
) -> StudyTime:
    """Run the study (its smoke form with ``smoke``) in a temporary store with the clocks in every run."""
    from mlflow.tracking import MlflowClient

    from ablate.sweeps.engine.context import RunContext
    from ablate.sweeps.plan import Machine, check_study
    from ablate.sweeps.smoke import smoke_study
    from ablate.sweeps.study import run_study

    with tempfile.TemporaryDirectory(prefix="ablate-bench-study-") as tmp:
        root = Path(tmp)
        if smoke:
            spec, base = smoke_study(spec, base, root, where)
        else:
            set_dotted(base, "tracking.root", str(root))
        check_study(spec, base, where, Machine.here())
        clock, stamps = StudyClock(), []

        def timed(what: str, start: float, end: float) -> None:
            stamps.append((what, start, end))

        uri = f"sqlite:///{root / 'mlflow.db'}"
        progress(f"{spec.name}: {spec.total_trials()} trials{' (smoke)' * smoke}")
        load, begin = os.getloadavg()[0], time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the runs' own lines go with the bench's status
            run_study(
                spec,
                base,
                storage=f"sqlite:///{root / 'optuna.db'}",
                tracking_uri=uri,
                where=where,
                hooks=RunContext(callbacks=(clock,), timed=timed),
            )
        wall = time.perf_counter() - begin
        client = MlflowClient(uri)
        runs = []
        for i, (a, b) in enumerate(sorted((s, e) for what, s, e in stamps if what == "run")):
            measured = [(s, e) for what, s, e in stamps if what == "measure" and a <= s <= b]
            fits = [f for f in clock.fits if a <= f.start <= b]
            name, shape = f"run {i + 1}", f"run {i + 1}"
            if fits and fits[0].run_id:
                got = client.get_run(fits[0].run_id)
                name = got.info.run_name or name
                shape = repr(sorted((k, v) for k, v in got.data.params.items() if k.startswith("model.")))
            runs.append(run_time((a, b), measured[0] if measured else None, fits, clock.validations, name, shape))
    return StudyTime(spec.name, runs, wall, "smoke form" if smoke else "as written", (load, os.getloadavg()[0]))


def report(t: StudyTime) -> list[str]:
    """The table (a row per run, their sum) and the last line."""
    head = ["run", *PARTS, "wall", "steps", "ms/step (steady)"]

    def row(name: str, parts: dict[str, float], wall: float, steps: int, step: str) -> str:
        cells = [name, *(f"{parts[p]:.2f}" for p in PARTS), f"{wall:.2f}", str(steps), step]
        return "| " + " | ".join(cells) + " |"

    summed = {p: sum(r.parts[p] for r in t.runs) for p in PARTS}
    in_runs = sum(r.wall for r in t.runs)
    repeats, which = t.repeats()
    steady = sum(r.step_s * r.steps for r in t.runs)
    return [
        f"### study {t.study} ({t.what}): {len(t.runs)} runs, wall time by part (s)",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 1),
        *(row(r.name, r.parts, r.wall, r.steps, f"{1e3 * r.step_s:.1f}") for r in t.runs),
        row("**all runs**", summed, in_runs, sum(r.steps for r in t.runs), ""),
        f"| study outside its runs (preflight, stores, parent run) | {' | ' * (len(PARTS) - 1)} | "
        f"{t.wall - in_runs:.2f} | | |",
        f"| **study** | {' | ' * (len(PARTS) - 1)} | {t.wall:.2f} | | |",
        "",
        f"- machine load (1-minute average) {t.load[0]:.2f} before, {t.load[1]:.2f} after",
        f"- steady-state step time: each run's median step after its first {WARMUP} (fewer in a short run); "
        f"steps x that time, summed: {steady:.1f} s of the study's {t.wall:.1f} s",
        f"- fixed cost of a repeat run (wall less training and validation), {which}: "
        f"{', '.join(f'{r.fixed:.1f}' for r in repeats) or 'none'} s",
        "",
        f"fixed cost of a repeat run: {t.repeat_cost:.1f} s; study efficiency: {t.efficiency:.2f}",
    ]


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    from ablate.sweeps.spec import load_study, validate_study

    where = str(args.study)  # given, and checked to be a study, by the command (ablate.commands)
    spec, base = load_study(where)
    if args.device != "auto":  # else each run's own trainer.accelerator
        set_dotted(base, "trainer.accelerator", device.type)
        validate_study(spec, base, where)
    bar = progress.add_task(spec.name, total=None)
    result = measure_study(spec, base, where, args.smoke, lambda what: progress.update(bar, description=what))
    progress.remove_task(bar)
    return report(result), True
