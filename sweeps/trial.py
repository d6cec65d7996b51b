"""One trial of a study: claim its configuration, train it as an MLflow run nested under the study's
parent (or take the run of an earlier attempt that finished, or go on in one that was stopped), and
record how it ended. :data:`OUTCOMES` is the one table of endings: each one's Optuna state, its run's
``ablate.state`` tag and the other tags and user attributes it sets.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Final

import lightning.pytorch as pl
import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from optuna_integration import PyTorchLightningPruningCallback
from rich.console import Console

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.sweeps import attempts, guard, study_model_runs, workers
from ablate.sweeps.chain import chained_trial
from ablate.sweeps.engine import checkpoints, tracking
from ablate.sweeps.engine.context import RunContext, RunResult
from ablate.sweeps.engine.interrupt import as_interrupted
from ablate.sweeps.engine.runner import run_name, train
from ablate.sweeps.spec import Params, StudySpec, trial_config
from ablate.sweeps.study_model_runs import StudyPlace

INTERRUPTED = workers.INTERRUPTED
RUN_ID = "mlflow_run_id"  # user attr of a trial that has a run: the run's id
TRAINING = "RUNNING"  # the ablate.state of a trial's run while it trains
_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)


class Outcome(Enum):
    """How a trial ends."""

    COMPLETE = "complete"  # trained and scored
    FINISHED_BEFORE_RETRY = "finished before retry"  # a retry took the run its dead attempt had finished
    PRUNED = "pruned"  # stopped by the study's pruner
    INTERRUPTED = "interrupted"  # stopped by a signal (SIGINT, SIGTERM)
    FAIL = "fail"  # raised
    LOST_CLAIM = "lost claim"  # another trial holds its configuration: no run


@dataclass(frozen=True)
class Ending:
    """What an outcome records: the Optuna state the objective leaves (by returning, raising
    TrialPruned or raising anything else), the ``ablate.state`` tag of its run (None: it has no
    run), the other tags of its run and the trial's user attrs (their values given when it ends;
    :data:`RUN_ID` too wherever there is a run), and the word its console line begins with."""

    optuna: TrialState
    state: str | None
    run_tags: tuple[str, ...] = ()
    user_attrs: tuple[str, ...] = ()
    said: str | None = None  # None: no line


OUTCOMES: Final[Mapping[Outcome, Ending]] = MappingProxyType(
    {
        Outcome.COMPLETE: Ending(TrialState.COMPLETE, "COMPLETE", said="COMPLETE"),
        Outcome.FINISHED_BEFORE_RETRY: Ending(
            TrialState.COMPLETE, "COMPLETE", run_tags=(tracking.TRIAL, attempts.FINISHED_BEFORE), said="COMPLETE"
        ),
        Outcome.PRUNED: Ending(TrialState.PRUNED, "PRUNED", said="PRUNED"),
        Outcome.INTERRUPTED: Ending(TrialState.FAIL, "INTERRUPTED", user_attrs=(INTERRUPTED,), said="interrupted by"),
        Outcome.FAIL: Ending(
            TrialState.FAIL, "FAIL", run_tags=(tracking.FAIL_REASON,), user_attrs=(tracking.FAIL_REASON,), said="FAILED"
        ),
        Outcome.LOST_CLAIM: Ending(TrialState.FAIL, None, user_attrs=(tracking.FAIL_REASON,)),
    }
)
"""Every outcome's :class:`Ending`, the one place the code reads what an ending records."""


class StepPruningCallback(PyTorchLightningPruningCallback):  # type: ignore[misc]  # optuna-integration: no type hints
    """optuna-integration's Lightning pruning callback, reporting at the optimizer step: ablate trains
    one endless epoch and validates every ``trainer.val_every`` steps, so the library's
    ``current_epoch`` would put every report at step 0; a run's later phases report at the run's
    steps (its logger's offset). Everything else (DDP included) is the library's own code."""

    @dataclass
    class _AtStep:
        current_epoch: int  # the only attribute the library's callback reads from the module

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the run's step: a later phase's fit goes on from the steps of the phases before it
        step = trainer.global_step + getattr(trainer.logger, "offset", 0)
        super().on_validation_end(trainer, self._AtStep(step))


@dataclass(frozen=True)
class TrialInputs:
    """What every trial of a study trains from: where the study is, its model (``runs:/ID`` or a
    folder: distilled from, pruned or quantized), each fine-tuning task's teacher, the model a
    study with ``source:`` fine-tunes (its architecture) and the study's running guard."""

    place: StudyPlace
    study_model: str | None = None
    task_teachers: Mapping[int, str] = field(default_factory=dict)
    source_cfg: ModelConfig | None = None
    guarded: guard.GuardRun | None = None

    @classmethod
    def start(
        cls,
        place: StudyPlace,
        study_model: str | None,
        task_teachers: Mapping[int, str],
        source_cfg: ModelConfig | None,
    ) -> TrialInputs:
        """The inputs, with the study's guard started (its reference read, said on the console)."""
        client: MlflowClient = place.client
        guarded = guard.start_guard(place.spec, client, place.parent, study_model, dict(task_teachers))
        if guarded is not None:
            _CONSOLE.print(f"guard: {guarded.describe()}", markup=False)
        return cls(place, study_model, task_teachers, source_cfg, guarded)

    def objective(self, trial: optuna.Trial) -> float:
        """The Optuna objective: :meth:`StudyTrial.run`. A trial a signal stopped says so (:data:`INTERRUPTED`)
        even before its run began, so that a worker still running takes its configuration again."""
        try:
            return StudyTrial(self, trial).run()
        except (KeyboardInterrupt, SystemExit) as exc:
            stop = as_interrupted(exc)
            if INTERRUPTED not in trial.user_attrs:  # stopped while it was being claimed or set up
                trial.set_user_attr(INTERRUPTED, stop.name)
            raise stop from None


@dataclass(frozen=True)
class StudyTrial:
    """One Optuna trial of a study, answered from the study's :class:`TrialInputs`."""

    given: TrialInputs
    trial: optuna.Trial

    @property
    def spec(self) -> StudySpec:
        return self.given.place.spec

    @property
    def client(self) -> MlflowClient:
        client: MlflowClient = self.given.place.client
        return client

    def run(self) -> float:
        """The value of the study's metric for this trial; Optuna records its state from what this
        returns or raises, and the run's tags say the same (:data:`OUTCOMES`)."""
        params = self.claim()
        if (kept := self.finished_earlier()) is not None:
            return kept
        cfg = self.config(params)
        ctx = self.context(params, cfg)
        self.announce(ctx)
        began = time.monotonic()
        try:
            result = self.train(cfg, ctx, params)
        except optuna.TrialPruned:
            self.end(Outcome.PRUNED, began)
            raise
        except (KeyboardInterrupt, SystemExit) as exc:  # SIGINT, SIGTERM: its runs are KILLED; Optuna fails it
            stop = as_interrupted(exc)
            self.end(Outcome.INTERRUPTED, began, {INTERRUPTED: stop.name}, f" {stop.name}")  # its reason: the run's
            raise stop from None
        except BaseException as exc:
            self.end(Outcome.FAIL, began, {tracking.FAIL_REASON: f"{type(exc).__name__}: {exc}"[:500]})
            raise
        return self.complete(result, began)

    def claim(self) -> Params:
        """The trial's configuration, sampled (or the one it was enqueued with) and claimed: a trial
        that lost the race for it to another raises :class:`~ablate.sweeps.workers.DuplicateTrial`."""
        params: Params = {name: space.suggest(self.trial, name) for name, space in self.spec.space.items()}
        try:
            workers.claim(self.trial.study, self.trial, params)
        except workers.DuplicateTrial as exc:
            self.record(Outcome.LOST_CLAIM, None, {tracking.FAIL_REASON: str(exc)})
            raise
        return params

    def finished_earlier(self) -> float | None:
        """The value of a retried trial whose dead attempt's run had FINISHED (its worker killed before
        Optuna recorded it): the run becomes this trial's, COMPLETE, and nothing trains again."""
        history = workers.retry_history(self.trial)
        metric = self.spec.optimize.metric
        found = attempts.finished_attempt(self.client, self.given.place.exp_id, self.spec.name, history, metric)
        if found is None:
            return None
        run_id, value = found
        dead = str(history[-1])
        self.record(
            Outcome.FINISHED_BEFORE_RETRY,
            run_id,
            {tracking.TRIAL: str(self.trial.number), attempts.FINISHED_BEFORE: dead},
        )
        said = OUTCOMES[Outcome.FINISHED_BEFORE_RETRY].said
        _CONSOLE.print(
            f"trial {self.trial.number}: {said}, {metric} {value:.4g}: the run of trial "
            f"{dead} had finished before its worker died ({run_id})",
            markup=False,
        )
        if self.given.guarded is not None:  # its run's guard, recorded on this trial
            self.given.guarded.record(self.trial, self.client, run_id, self.client.get_run(run_id).data.metrics)
        return value

    def config(self, params: Params) -> ExperimentConfig:
        """The trial's config; with ``source:``, its model the source's (the tasks fine-tune it)."""
        cfg = trial_config(self.given.place.base, self.spec, params, self.given.study_model)
        return cfg if self.given.source_cfg is None else replace(cfg, model=self.given.source_cfg)

    def tags(self, cfg: ExperimentConfig) -> dict[str, str]:
        """The tags its run starts with; its study model's only where the trial distils from it."""
        tags = {
            tracking.ROLE: "trial",
            tracking.STUDY: self.spec.name,
            tracking.TRIAL: str(self.trial.number),
            tracking.WORKER: tracking.worker_id(),
        }
        if (model := self.given.study_model) is not None:
            tags |= study_model_runs.model_tags(model, teaches=cfg.distill.teacher == model)
        return {**tags, tracking.STATE: TRAINING}

    def context(self, params: Params, cfg: ExperimentConfig) -> RunContext:
        """Where and how its run trains: nested under the study's parent, pruned at its steps,
        checkpointed per config, going on in a stopped attempt's run where one left a checkpoint."""
        place = self.given.place
        where = checkpoints.location(self.spec.checkpoints, place.uri, cfg.tracking.root)
        ckpt = checkpoints.trial_place(where, cfg.tracking.root, self.spec.name, cfg)
        earlier = attempts.stopped_attempt(self.client, place.exp_id, ckpt, chained=bool(self.spec.tasks))
        return RunContext(
            tracking_uri=place.uri,
            experiment=self.spec.name,
            parent_run_id=place.parent,
            name=run_name(params),
            tags=self.tags(cfg),
            params={"variant": str(params["variant"])} if "variant" in params else {},
            callbacks=(StepPruningCallback(self.trial, monitor=self.spec.optimize.metric),),
            checkpoint=ckpt,
            resume=True,
            reopen=earlier,
        ).hooked(place.hooks)

    def announce(self, ctx: RunContext) -> None:
        """The line that says the trial starts: its number, its place among the study's trials, its
        run's name, and the stopped attempt's run it goes on in."""
        done = sum(t.state in workers.DONE for t in self.trial.study.get_trials(deepcopy=False))
        again = f" (going on in run {ctx.reopen} from its checkpoint)" if ctx.reopen else ""
        count = f"[{done + 1}/{self.spec.total_trials()}]"
        _CONSOLE.print(f"trial {self.trial.number} {count}: {ctx.name}{again}", markup=False)

    def train(self, cfg: ExperimentConfig, ctx: RunContext, params: Params) -> RunResult:
        """Its run: with fine-tuning tasks, pretrain -> (intrinsic) -> fine-tune on each of its tasks
        (each stage a run nested in the trial's; a study with ``source:`` only fine-tunes)."""
        if not self.spec.tasks:
            return train(cfg, ctx)
        variant = params.get("variant")
        mine = [i for i, task in enumerate(self.spec.tasks) if task.runs_for(variant)]  # this trial's tasks
        teachers = self.given.task_teachers
        return chained_trial(
            cfg,
            [self.spec.tasks[i] for i in mine],
            ctx,
            task_teachers={j: teachers[i] for j, i in enumerate(mine) if i in teachers},
            study_model=self.given.study_model,
            wnli=self.spec.glue_wnli,
            source=self.spec.source,
        )

    def complete(self, result: RunResult, began: float) -> float:
        """Record a trained trial COMPLETE and return its value (KeyError naming the metric if its
        run did not log it); a guarded study's verdict is recorded and said too."""
        self.record(Outcome.COMPLETE, result.run_id, {})
        metric, metrics = self.spec.optimize.metric, result.metrics
        if metric not in metrics:  # a model's accounting (params.*, model_bytes) is logged at its start
            metrics = {**self.client.get_run(result.run_id).data.metrics, **metrics}
        if metric not in metrics:
            raise KeyError(f"optimize.metric: {metric!r} was not logged; logged: {', '.join(sorted(metrics))}")
        value, said = metrics[metric], ""
        if (guarded := self.given.guarded) is not None:  # the trial's constraint: within the bound or not
            logged = metrics if guarded.guard.metric in metrics else self.client.get_run(result.run_id).data.metrics
            verdict = guarded.record(self.trial, self.client, result.run_id, {**logged, **metrics})
            said = f", {guarded.guard.metric} {verdict.value:.4g} {'within' if verdict.met else 'past'} the bound"
        self.ended(Outcome.COMPLETE, began, f", {metric} {value:.4g}{said}")
        return value

    def end(self, outcome: Outcome, began: float, values: Mapping[str, str] | None = None, how: str = "") -> None:
        """Record a trial that raised as ``outcome`` on the trial and its newest run (if it made one)."""
        self.record(outcome, self.last_run(), values or {})
        self.ended(outcome, began, how)

    def record(self, outcome: Outcome, run_id: str | None, values: Mapping[str, str]) -> None:
        """Set what :data:`OUTCOMES` says ``outcome`` sets: its user attrs on the trial and, where it has
        a run, the run's ``ablate.state`` and other tags (``values``: theirs) and the run's id on the trial."""
        ending = OUTCOMES[outcome]
        if set(values) != {*ending.run_tags, *ending.user_attrs}:
            raise ValueError(f"{outcome}: values of {sorted(values)}, not of {ending}")
        for key in ending.user_attrs:
            self.trial.set_user_attr(key, values[key])
        if run_id is None or ending.state is None:
            return
        self.client.set_tag(run_id, tracking.STATE, ending.state)
        for key in ending.run_tags:
            self.client.set_tag(run_id, key, values[key])
        self.trial.set_user_attr(RUN_ID, run_id)

    def last_run(self) -> str | None:
        """The trial's newest MLflow run (None: it made none)."""
        number = self.trial.number
        runs = self.client.search_runs(
            [self.given.place.exp_id],
            filter_string=f"tags.`{tracking.STUDY}` = '{self.spec.name}' and tags.`{tracking.TRIAL}` = '{number}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return str(runs[0].info.run_id) if runs else None

    def ended(self, outcome: Outcome, began: float, how: str = "") -> None:
        """The line that says how the trial ended (its :class:`Ending`'s word, then ``how``) and how long it took."""
        _CONSOLE.print(
            f"trial {self.trial.number}: {OUTCOMES[outcome].said}{how} after {took(time.monotonic() - began)}",
            markup=False,
        )


def took(seconds: float) -> str:
    """``41.2 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes} min {sec:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"
