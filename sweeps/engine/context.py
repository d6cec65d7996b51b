"""What a run is given, what it works in, and its life: one frozen value each, not a bundle of keywords.

:class:`RunContext` (where the run is recorded, how it trains), :class:`Prepared` (a regime's run made ready),
:class:`ActiveRun` (the MLflow run once it exists: metrics outside Lightning's loop, its phase) and
:func:`tracked_run` (its life: RUNNING until its work is done, then FINISHED, FAILED or KILLED)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from optuna import TrialPruned

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.metric_names import check_name
from ablate.sweeps.engine import checkpoints, tracking
from ablate.sweeps.engine.interrupt import as_interrupted, signalled

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule
    from lightning.pytorch.callbacks import Callback

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class RunContext:
    """Where a run is recorded and how it trains.

    Attributes:
        tracking_uri: the MLflow store; None: the config's ``tracking`` section.
        experiment: the MLflow experiment; None: the config's.
        parent_run_id: the run this one is nested under (a study's parent, a trial).
        name: the run's name; None: ``tracking.run_name`` or the config's name.
        tags: tags set when the run is created.
        params: params logged beside the config's (a study's ``variant``).
        callbacks: Lightning callbacks of its fits (a sweep's pruning callback): the run's own, which a
            chained trial's fine-tuning stages do not keep.
        clocks: Lightning callbacks that only watch (a benchmark's clocks): in every Trainer of the run and
            of every stage nested in it.
        checkpoint: where its last and best checkpoints go; None: none kept.
        resume: a ``last.ckpt`` to start from, or True: what an earlier attempt at the config left.
        reopen: an existing run (KILLED) to continue instead of starting a new one: the attempt whose
            checkpoint ``resume`` starts from (``ablate train --resume``, a retried trial), so that its
            curves go on in the same run.
        timed: told ``(what, start, end)`` (``time.perf_counter`` seconds) of the run's timed parts
            (``measure``: its parameter, FLOP, latency and memory measurement; ``finisher:<name>``: each
            finisher of its plan; ``run``: the whole run, from its preparation to its end): the benchmark's
            hook, kept by every stage nested in it.
        started: told the run once it exists (``ablate train`` says its id, store and how to resume it);
            not kept by the stages nested in it.
    """

    tracking_uri: str | None = None
    experiment: str | None = None
    parent_run_id: str | None = None
    name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    callbacks: tuple[Callback, ...] = ()
    clocks: tuple[Callback, ...] = ()
    checkpoint: checkpoints.CheckpointPlace | None = None
    resume: str | bool = False
    reopen: str | None = None
    timed: Callable[[str, float, float], None] | None = None
    started: Callable[[ActiveRun], None] | None = None

    def measure(self, what: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``what(*args, **kwargs)`` (the run's measurement), its start and end told to ``timed``."""
        with self.timing("measure"):
            return what(*args, **kwargs)

    @contextlib.contextmanager
    def timing(self, what: str) -> Iterator[None]:
        """Tell ``timed`` the start and end of the block (``what``: the part it is), however it ends."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.timed is not None:
                self.timed(what, start, time.perf_counter())

    def hooked(self, hooks: RunContext) -> RunContext:
        """This context with ``hooks``' callbacks and clocks after its own and its ``timed`` hook (when it
        has one): what a study gives every run it starts (a benchmark's clocks)."""
        return dataclasses.replace(
            self,
            callbacks=(*self.callbacks, *hooks.callbacks),
            clocks=(*self.clocks, *hooks.clocks),
            timed=hooks.timed or self.timed,
        )

    def nested(
        self, parent_run_id: str, name: str, tags: Mapping[str, str], *, trains: bool = False, reopen: str | None = None
    ) -> RunContext:
        """A stage run under ``parent_run_id`` in the same store and experiment; with ``trains`` it keeps
        this context's callbacks, checkpoints and resume (a chained trial's pre-training), else none; its
        clocks and ``timed`` hook always; ``reopen``: the stage run of an earlier attempt to continue."""
        stage = dataclasses.replace(
            self, parent_run_id=parent_run_id, name=name, tags=dict(tags), params={}, reopen=reopen, started=None
        )
        return stage if trains else dataclasses.replace(stage, callbacks=(), checkpoint=None, resume=False)


@dataclass(frozen=True)
class ActiveRun:
    """An MLflow run that exists: its client, id, store and name, and the phase it is in."""

    client: MlflowClient
    run_id: str
    uri: str
    name: str = ""
    _phase: list[str] = field(default_factory=list, repr=False)  # the phase now, once one has begun

    def log(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Log ``metrics`` at ``step`` in one request; every name must be one the registry knows."""
        for name in metrics:
            check_name(name)
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit per request
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def tag(self, key: str, value: str) -> None:
        """Set tag ``key`` on the run."""
        self.client.set_tag(self.run_id, key, value)

    def text(self, text: str, artifact: str) -> None:
        """Store ``text`` as the run's artifact ``artifact`` (a path inside its artifacts)."""
        self.client.log_text(self.run_id, text, artifact)

    def phase(self, name: str, detail: str = "") -> None:
        """Say that the run begins phase ``name`` (``fine-tuning``, ``exits``, ``QAT`` ...): one status line
        on stderr, and the run's tag ``ablate.phase``, so that a run stopped in it says where."""
        self._phase[:] = [name]
        self.tag(tracking.PHASE, name)
        say(f"{self.name or self.run_id[:8]}: {name}" + (f": {detail}" if detail else ""))

    @property
    def current_phase(self) -> str | None:
        """The phase begun last (None: none said)."""
        return self._phase[0] if self._phase else None


def say(line: str) -> None:
    """One status line on stderr (beside Lightning's progress bars, which also write there)."""
    print(line, file=sys.stderr, flush=True)


M = TypeVar("M")
H = TypeVar("H")


@dataclass(frozen=True)
class Prepared(Generic[M, H]):
    """A run made ready before it exists: everything checked and loaded, nothing recorded yet.

    Attributes:
        cfg: the config the run logs (a source's architecture, a teacher's resolved settings).
        materials: what its phases and finishers work on (module, source, ...), loaded.
        handed: what its first phase is handed (its regime's starting value).
        data: the data its fits read.
        tokenizer: the tokenizer file logged with it.
        tags: tags its regime adds (the teacher's or source's run).
        inputs: metrics logged at step 0 (parameter counts, FLOPs, latency).
        params: params its regime adds (where latency was measured).
        begin: what the run does first, once it exists (its baselines; told whether it goes on from an
            earlier attempt, which logged them already).
    """

    cfg: ExperimentConfig
    materials: M
    handed: H
    data: LightningDataModule
    tokenizer: Path | None
    tags: Mapping[str, str] = field(default_factory=dict)
    inputs: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    begin: Callable[[ActiveRun, bool], None] | None = None


Prepare = Callable[[ExperimentConfig, RunContext, str, ExitStack], Prepared[Any, Any]]
"""A regime's preparation: its config, context, the resolved store and a stack for what must
outlive the preparation (temporary folders), closed when the run has ended."""


@dataclass
class RunResult:
    """What a finished run produced."""

    run_id: str
    tracking_uri: str
    metrics: dict[str, float] = field(default_factory=dict)


def tracked_run(
    cfg: ExperimentConfig,
    uri: str,
    work: Callable[[ActiveRun], dict[str, float]],
    ctx: RunContext,
    *,
    tags: Mapping[str, str],
    inputs: Mapping[str, float],
    tokenizer: Path | None,
    params: Mapping[str, str] | None = None,
) -> RunResult:
    """Run ``work`` inside a new MLflow run placed as ``ctx`` says, which logs ``cfg``, ``inputs``
    (metrics at step 0), ``params`` and ``ctx.params`` and the tokenizer first (``tags`` beside
    ``ctx.tags``).

    The run is RUNNING until ``work`` has returned: every phase, evaluation and artifact of it. It then
    ends FINISHED; FAILED if anything raised (the reason in its ``ablate.fail_reason`` tag); KILLED if a
    signal stopped it (SIGINT, SIGTERM: the reason ``signal SIGTERM`` and the phase it was in), which is
    re-raised as :class:`~ablate.sweeps.engine.interrupt.Interrupted`. An Optuna prune ends it FINISHED and is
    re-raised."""
    client = tracking.connect(uri)
    experiment = ctx.experiment or tracking.experiment_name(cfg.tracking.experiment)
    # the params and config.yaml name the experiment the run is in, not None
    cfg = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, experiment=experiment))
    exp_id = tracking.experiment_id(client, experiment, uri)
    name = ctx.name or cfg.tracking.run_name or cfg.name
    run_tags = {tracking.ROLE: "run", **tags, **ctx.tags}
    if ctx.reopen is not None:  # an earlier attempt's run, continued: its inputs are logged already
        run_id = tracking.reopen_run(client, ctx.reopen, run_tags)
    else:
        run_id = tracking.start_run(client, exp_id, name, run_tags, ctx.parent_run_id)
    run = ActiveRun(client, run_id, uri, name)
    if ctx.started is not None:
        ctx.started(run)
    sigint = signal.getsignal(signal.SIGINT)
    rearm = True  # Lightning ignores SIGINT after an interrupt; ablate's own handler ignores a second signal
    try:
        if ctx.reopen is None:
            tracking.log_run_inputs(client, run_id, cfg, dict(inputs), tokenizer)
            for key, value in {**(params or {}), **ctx.params}.items():  # measured_on, a study's variant
                client.log_param(run_id, key, value)
        metrics = work(run)
    except TrialPruned:  # stopped early by the sweep's pruner: a finished, shorter run
        tracking.end_run(client, run_id, "FINISHED")
        raise
    except (KeyboardInterrupt, SystemExit) as exc:  # an Interrupted; SystemExit: how Lightning ends an interrupted fit
        stop = as_interrupted(exc)
        rearm = signalled(exc) is None  # ours stays disarmed until the process has ended its runs
        during = f" during {run.current_phase}" if run.current_phase else ""
        tracking.end_killed(client, run_id, f"{stop}{during}")
        stop.runs.append(run_id)
        raise stop from None
    except BaseException as exc:
        with contextlib.suppress(Exception):  # why, on the run itself, unless a stage said it already
            if tracking.FAIL_REASON not in client.get_run(run_id).data.tags:
                client.set_tag(run_id, tracking.FAIL_REASON, tracking.fail_reason(exc))
        tracking.end_run(client, run_id, "FAILED")
        raise
    finally:
        if rearm:
            signal.signal(signal.SIGINT, sigint)
    tracking.end_run(client, run_id, "FINISHED")
    return RunResult(run_id=run_id, tracking_uri=uri, metrics=metrics)
