"""Many workers, one study, Optuna's RDB storage the coordinator: the creator enqueues every grid point
and the MLflow parent run, workers pop trials from the queue, heartbeats fail and retry a dead
worker's trial (from its last checkpoint), and a worker returns when the study is complete
(docs/many-machines.md)."""

from __future__ import annotations

import contextlib
import itertools
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import IntegrityError, ProgrammingError

from ablate.lightning_modules.config.yamlio import Json
from ablate.sweeps.engine import tracking
from ablate.sweeps.spec import Params, StudySpec

if TYPE_CHECKING:
    from mlflow import MlflowClient

QUEUE = "ablate.queue"  # study user attr: "filling" while the creator enqueues the grid, then "ready"
PARENT_RUN = "ablate.parent_run"  # study user attr: the MLflow parent run id
DONE = (TrialState.COMPLETE, TrialState.PRUNED)
INTERRUPTED = "ablate.interrupted"  # user attr of a trial a signal stopped (Optuna's state: FAIL): the signal
MAX_RETRY = 3
SCHEMA_ATTEMPTS = 5

# heartbeats and their retry callback are "experimental" in Optuna 5: ablate relies on them knowingly
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class QueuedGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, also recording the grid point of an enqueued trial.

    ``GridSampler`` leaves enqueued trials (``fixed_params``) without a ``grid_id``, so it
    would count them as unvisited and fail in ``after_trial`` on the last grid point; ablate
    enqueues every point, so each trial gets the id of the point it fixes.
    """

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        fixed = trial.system_attrs.get("fixed_params")
        if fixed is not None and "grid_id" not in trial.system_attrs:
            point = tuple(fixed.get(name) for name in self._param_names)
            if point in self._all_grids:
                study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
                study._storage.set_trial_system_attr(trial._trial_id, "grid_id", self._all_grids.index(point))
                return
        super().before_trial(study, trial)


class DuplicateTrial(Exception):
    """Another trial already ran, or is running, this configuration (lost a race for it)."""


def params_of(trial: FrozenTrial) -> Params:
    """A trial's configuration: its suggested params, or the fixed ones it was enqueued with."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params") or {})


def retry_history(trial: optuna.Trial) -> list[int]:
    """The numbers of the dead attempts a trial retries, oldest first (empty: not a retry)."""
    frozen = trial.study.get_trials(deepcopy=False)[trial.number]  # a study's trials are in number order
    return RetryHeartbeatStaleTrialCallback.retry_history(frozen)


def key(params: Mapping[str, Json]) -> tuple[tuple[str, Json], ...]:
    return tuple(sorted(params.items()))


class HeartbeatStorage(RDBStorage):
    """Optuna's RDB storage, recording a trial's first heartbeat as the trial is taken (RUNNING).

    Optuna records it once the trial's heartbeat thread starts, and never finds stale a RUNNING
    trial that has none: a worker killed in between held its configuration for ever, every other
    worker waiting on it. Such a trial (also one taken by a worker without this class) is stale here
    once it was taken a grace period ago. ``taken``: the trials this process took, for
    :func:`release_taken` (a worker stopped by a signal in between).
    """

    def __init__(self, url: str, heartbeat: int, on_stale: Callable[[optuna.Study, FrozenTrial], None]) -> None:
        super().__init__(
            url,
            engine_kwargs={"pool_pre_ping": True} if url.startswith("postgresql") else {},
            heartbeat_interval=heartbeat,
            grace_period=3 * heartbeat,
            heartbeat_stale_trial_callback=on_stale,
        )
        self.taken: list[int] = []

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        taken = super().set_trial_state_values(trial_id, state, values)
        if taken and state == TrialState.RUNNING:
            self._took(trial_id)
        return taken

    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
        trial = super()._create_new_trial(study_id, template_trial)  # what Optuna's cached storage calls
        if trial.state == TrialState.RUNNING:  # ask() with an empty queue
            self._took(trial._trial_id)
        return trial

    def _took(self, trial_id: int) -> None:
        self.taken.append(trial_id)
        self.record_heartbeat(trial_id)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return super()._get_stale_trial_ids(study_id) + self._never_beaten(study_id)

    def _never_beaten(self, study_id: int) -> list[int]:
        """RUNNING trials without a heartbeat, taken over a grace period ago (by the clock that set their
        ``datetime_start``: a worker's own; Optuna compares heartbeats by the database's)."""
        taken_before = datetime.now() - timedelta(seconds=self.grace_period or 2 * (self.heartbeat_interval or 0))
        with _create_scoped_session(self.scoped_session) as session:
            trials = (
                session.query(models.TrialModel)
                .filter(models.TrialModel.study_id == study_id, models.TrialModel.state == TrialState.RUNNING)
                .filter(~models.TrialModel.heartbeats.any())
                .all()
            )
            return [int(t.trial_id) for t in trials if t.datetime_start is not None and t.datetime_start < taken_before]


def storage(url: str, heartbeat: int, on_stale: Callable[[optuna.Study, FrozenTrial], None]) -> HeartbeatStorage:
    """An RDB storage (SQLite or PostgreSQL) with heartbeats and a callback for stale trials."""
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            return HeartbeatStorage(url, heartbeat, on_stale)
        except (IntegrityError, ProgrammingError):
            # Workers started together on an empty database race to create Optuna's tables
            # (PostgreSQL: duplicate pg_type / "relation already exists"); the loser retries
            # and finds them made. A refused connection is an OperationalError: not retried.
            if attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.2 + random.random())
    raise AssertionError("unreachable")


def retry_stale(
    mark_killed: Callable[[optuna.Study, FrozenTrial], None],
) -> Callable[[optuna.Study, FrozenTrial], None]:
    """The stale-trial callback: end the dead attempt's MLflow run KILLED, then enqueue a retry."""
    retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY, inherit_intermediate_values=True)

    def on_stale(study: optuna.Study, trial: FrozenTrial) -> None:
        mark_killed(study, trial)
        retry(study, trial)

    return on_stale


def grid_points(spec: StudySpec) -> list[Params]:
    """Every configuration of a grid study, in grid order."""
    grid = spec.grid()
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def fill_queue(study: optuna.Study, spec: StudySpec, created: bool, wait_s: float = 120.0) -> int:
    """Enqueue the grid points no trial holds (all of them in a new study); return how many.

    Only the creator of a new study fills its queue; a worker that loads it meanwhile
    waits until the queue is ready, so two workers started together never enqueue twice.
    """
    if spec.sampler != "grid":
        return 0
    if created:
        study.set_user_attr(QUEUE, "filling")
    else:
        deadline = time.monotonic() + wait_s
        while study.user_attrs.get(QUEUE) == "filling" and time.monotonic() < deadline:  # read from storage
            time.sleep(1.0)
    trials = study.get_trials(deepcopy=False)
    held = _held(trials)
    failed = {key(params_of(t)) for t in trials if t.state == TrialState.FAIL}
    todo = [p for p in grid_points(spec) if key(p) not in held]
    # in a seeded random order, as Optuna's own GridSampler draws its points: a pruner compares
    # each trial with those before it, and grid order (all of one learning rate first) would
    # hand it the worst trials first
    random.Random(spec.name).shuffle(todo)
    todo.sort(key=lambda p: key(p) in failed)  # configurations never tried first
    for params in todo:
        study.enqueue_trial(params)
    if created or QUEUE not in study.user_attrs:
        study.set_user_attr(QUEUE, "ready")
    return len(todo)


def _held(trials: list[FrozenTrial]) -> set[tuple[tuple[str, Json], ...]]:
    """The configurations a trial holds: done, running or queued."""
    return {key(params_of(t)) for t in trials if t.state in (*DONE, TrialState.RUNNING, TrialState.WAITING)}


def requeue_interrupted(study: optuna.Study, spec: StudySpec) -> int:
    """Enqueue again the grid points whose last attempt a signal stopped (another worker's SIGINT or SIGTERM)
    and that no trial holds now, so that the workers still running take them, each going on from its
    checkpoint; how many. A point whose last attempt failed otherwise waits for the next invocation, as any
    failure does. (Other samplers count such a trial as not done and sample another.)"""
    if spec.sampler != "grid":
        return 0
    trials = study.get_trials(deepcopy=False)  # in number order: the last attempt at a point comes last
    held, last = _held(trials), {key(params_of(t)): t for t in trials}
    stopped = [
        t for k, t in last.items() if k not in held and t.state == TrialState.FAIL and INTERRUPTED in t.user_attrs
    ]
    for trial in stopped:
        study.enqueue_trial(params_of(trial))
    return len(stopped)


def claim(study: optuna.Study, trial: optuna.Trial, params: Mapping[str, Json]) -> None:
    """Raise :class:`DuplicateTrial` if another trial holds ``params``: finished, or running with
    a smaller number (of two racing trials the older one runs)."""
    mine = key(params)
    for other in study.get_trials(deepcopy=False, states=(*DONE, TrialState.RUNNING)):
        if other.number == trial.number or key(params_of(other)) != mine:
            continue
        if other.state != TrialState.RUNNING or other.number < trial.number:
            raise DuplicateTrial(f"configuration {dict(mine)} is held by trial {other.number} ({other.state.name})")


def stop_when_drained(spec: StudySpec) -> Callable[[optuna.Study, FrozenTrial], None]:
    """A study callback: stop this worker once no configuration is left to take.

    A grid study is drained when its queue is empty: every configuration was taken in this
    invocation (one that failed is retried by the next invocation, not in a loop now).
    """

    def callback(study: optuna.Study, _: FrozenTrial) -> None:
        trials = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return
        if spec.sampler == "grid" or sum(t.state in DONE for t in trials) >= spec.total_trials():
            study.stop()

    return callback


def release_taken(study: optuna.Study, storage: HeartbeatStorage, signal_name: str) -> list[int]:
    """Fail, marked stopped by ``signal_name``, the trials this worker took that are still RUNNING: a signal
    in Optuna's ``ask`` stops a worker before its trial began (Optuna fails a trial only once it runs), and
    the workers going on take its configuration at once rather than after its grace period. Their numbers."""
    released: list[int] = []
    try:
        for trial_id in storage.taken:
            trial = study._storage.get_trial(trial_id)
            if trial.state != TrialState.RUNNING:
                continue
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # another worker found it stale
                study._storage.set_trial_user_attr(trial_id, INTERRUPTED, signal_name)
                study._storage.set_trial_state_values(trial_id, TrialState.FAIL)
                released.append(trial.number)
    except Exception:  # noqa: BLE001 - a stopping worker says the study stopped rather than fail on the way out
        pass  # the storage unreachable: its trials go stale instead
    return released


def others_running(study: optuna.Study) -> list[FrozenTrial]:
    """Trials still RUNNING after this worker's own have ended (other workers' or dead ones)."""
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def others_alive(study: optuna.Study) -> bool:
    """Whether other workers are still running trials of ``study`` once this one's have ended (a dead
    worker's trials, silent past their heartbeat, are failed first). Unknown (the storage unreachable): False."""
    try:
        optuna.storages.fail_stale_trials(study)
        return bool(others_running(study))
    except Exception:  # noqa: BLE001 - a stopping worker says the study stopped rather than fail on the way out
        return False


def wait_for_others(study: optuna.Study, poll_s: float, log: Callable[[str], None]) -> bool:
    """Wait until no trial is RUNNING; fail stale ones on the way. True if retries were enqueued."""
    told = False
    while running := others_running(study):
        if not told:
            log(f"waiting for {len(running)} running trial(s) of other workers (or for them to go stale)")
            told = True
        time.sleep(poll_s)
        optuna.storages.fail_stale_trials(study)
    return any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False))


def shared_parent(
    study: optuna.Study, created: bool, create: Callable[[], str], find: Callable[[], str | None], wait_s: float = 120.0
) -> str:
    """The study's MLflow parent run: made by the study's creator, found by the others."""
    if created:
        run_id = find() or create()
        study.set_user_attr(PARENT_RUN, run_id)
        return run_id
    deadline = time.monotonic() + wait_s
    while PARENT_RUN not in study.user_attrs and time.monotonic() < deadline:  # read from storage
        if find() is not None:
            break
        time.sleep(1.0)
    run_id = study.user_attrs.get(PARENT_RUN) or find() or create()
    if PARENT_RUN not in study.user_attrs:
        study.set_user_attr(PARENT_RUN, run_id)
    return run_id


def mark_killed(client: MlflowClient, exp_id: str, study_name: str) -> Callable[[FrozenTrial], None]:
    """End the MLflow run(s) of a dead trial attempt KILLED, state FAIL."""

    def mark(trial: FrozenTrial) -> None:
        runs = client.search_runs(
            [exp_id],
            filter_string=(
                f"tags.`{tracking.STUDY}` = '{study_name}' and tags.`{tracking.TRIAL}` = '{trial.number}' "
                f"and attributes.status = 'RUNNING'"
            ),
        )
        for run in runs:
            for nested in client.search_runs(
                [exp_id],
                filter_string=(f"tags.`{tracking.PARENT}` = '{run.info.run_id}' and attributes.status = 'RUNNING'"),
            ):
                tracking.end_killed(client, nested.info.run_id)
            tracking.set_tags_once(client, run.info.run_id, {tracking.STATE: "FAIL"})
            tracking.end_killed(client, run.info.run_id)

    return mark
