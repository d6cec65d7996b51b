"""Run a study: an Optuna study whose trials are MLflow runs nested under one parent run. Optuna's
storage coordinates the workers and makes the study resumable (the same command continues it). One
trial: :mod:`~ablate.sweeps.trial`; the study's own model: :mod:`~ablate.sweeps.study_model_runs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

from ablate.datamodules.catalog import active_catalog
from ablate.datamodules.pretrain import PretrainDataModule
from ablate.datamodules.tokenizer import run_vocab_size
from ablate.lightning_modules.config.errors import ConfigError, StorageError, require_driver
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.sweeps import study_model_runs, study_source, workers
from ablate.sweeps.base import StudyBase
from ablate.sweeps.definition import check_unchanged
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.interrupt import as_interrupted
from ablate.sweeps.engine.weights import RUNS
from ablate.sweeps.search_changes import check_search_space
from ablate.sweeps.spec import StudySpec, corner_configs, study_model_config
from ablate.sweeps.trial import TrialInputs

DONE = workers.DONE
FAIL_REASON = tracking.FAIL_REASON
_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)  # what the study does besides its trials


@dataclass
class StudyResult:
    """Where a study's results are."""

    study: optuna.Study
    tracking_uri: str
    storage: str
    parent_run_id: str


def default_storage(root: str | Path) -> str:
    """Embedded Optuna storage next to the MLflow store."""
    folder = Path(root).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


def open_study(
    spec: StudySpec, storage: optuna.storages.BaseStorage, max_steps: int, url: str
) -> tuple[optuna.Study, bool]:
    """Create or load the Optuna study; also whether this call created it.

    Raises:
        StorageError: naming the URL, if the storage cannot be opened.
    """
    samplers: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
        "grid": lambda: workers.QueuedGridSampler(spec.grid(), seed=0),
        "tpe": lambda: optuna.samplers.TPESampler(seed=0),
        "random": lambda: optuna.samplers.RandomSampler(seed=0),
    }
    sampler, pruner = samplers[spec.sampler](), spec.pruner.build(max_steps)
    try:
        try:
            study = optuna.create_study(
                study_name=spec.name,
                storage=storage,
                sampler=sampler,
                pruner=pruner,
                direction=spec.optimize.direction,
            )
            return study, True
        except optuna.exceptions.DuplicatedStudyError:
            return optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner), False
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors vary by backend
        raise StorageError(
            f"--storage {tracking.redact(url)}: cannot open the Optuna study "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        ) from None


def connect_storage(
    url: str, heartbeat: int, on_stale: Callable[[optuna.Study, FrozenTrial], None]
) -> workers.HeartbeatStorage:
    """The Optuna RDB storage at ``url``, with heartbeats (StorageError naming the URL if unreachable)."""
    require_driver(url)  # postgresql:// without psycopg: one line naming the extra
    try:
        return workers.storage(url, heartbeat, on_stale)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors vary by backend
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise StorageError(
            f"--storage {tracking.redact(url)}: cannot open the Optuna storage ({type(exc).__name__}: {first})"
        ) from None


def preflight(spec: StudySpec, base: StudyBase) -> None:
    """Check every corpus the study reads (its study model's too) and train (or load) its tokenizers
    before anything is written, so that a missing or empty corpus, or a study model folder that is
    not there, fails with nothing half-created."""
    study_model = spec.study_model
    source = study_model.source if study_model is not None else None
    catalog = active_catalog()
    mapped = source is not None and catalog is not None and catalog.model(source) is not None  # checked by the plan
    if study_model is not None and source is not None and not source.startswith(RUNS) and not Path(source).is_dir():
        if not mapped:
            raise ConfigError(
                f"{study_model.SECTION}.source: {source}: neither {RUNS}RUN_ID nor an existing folder (nor a "
                "model of the data catalog)"
            )
    configs = corner_configs(spec, base) if spec.source is None else []  # source: nothing pre-trains
    if study_model is not None and study_model.model is not None:
        configs.append(study_model_config(base, spec))
    seen = set()
    for cfg in configs:
        key = (cfg.data, cfg.model.vocab_size)
        if key not in seen:
            seen.add(key)
            PretrainDataModule(cfg.data, cfg.objective, run_vocab_size(cfg), cfg.seed).prepare_data()


def run_study(
    spec: StudySpec,
    base: StudyBase,
    *,
    storage: str | None = None,
    tracking_uri: str | None = None,
    n_trials: int | None = None,
    where: str = "study",
    keep_going: bool = False,
    tags: dict[str, str] | None = None,
    hooks: RunContext = RunContext(),  # noqa: B008 - frozen
) -> StudyResult:
    """Run the study (as one of possibly many workers) until it is complete, or until this
    worker has run ``n_trials`` more trials. A study whose name has trials of another definition
    (edited since they ran) is refused before anything is written (``where``: its file, for the message).
    A trial that fails stops the study, unless ``keep_going`` (a smoke study: every trial runs).
    ``tags`` go on the study's parent run (its command-line overrides: ``ablate.overrides``). ``hooks``:
    callbacks and a ``timed`` hook every run of the study gets, its trials' and its study models' (the
    clocks of ``ablate bench study``)."""
    base_cfg = corner_configs(spec, base)[0]  # where the study is tracked (a trial's own settings)
    preflight(spec, base)
    killed: list[Callable[[optuna.Study, FrozenTrial], None]] = []  # set once the MLflow experiment is known
    on_stale = workers.retry_stale(lambda study, stale: killed[0](study, stale))
    stores = _open_stores(spec, base, base_cfg, storage, tracking_uri, where, on_stale)
    client, study = stores.client, stores.study
    exp_id = tracking.experiment_id(client, spec.name, stores.uri)
    killed.append(study_model_runs.on_stale(client, exp_id, spec.name, workers.mark_killed(client, exp_id, spec.name)))
    parent = _parent_run(spec, stores, exp_id, {"ablate.storage": tracking.redact(stores.url), **(tags or {})})
    _tidy(spec, stores, exp_id)
    poll_s = min(5.0, spec.heartbeat)
    place = study_model_runs.StudyPlace(spec, base, client, exp_id, stores.uri, parent, stores.storage, poll_s, hooks)
    tracking.reopen_run(client, parent, {})  # RUNNING, without the reason an earlier stop gave
    try:  # the study model's training, too, ends the parent FAILED or KILLED if it fails or is interrupted
        if _count_left(study, spec) or workers.others_running(study):
            _run_trials(place, study, stores.source_cfg, n_trials, keep_going)
    except (KeyboardInterrupt, SystemExit) as exc:  # SIGINT, SIGTERM: the trial's runs are KILLED already
        stop = as_interrupted(exc)
        workers.release_taken(study, stores.storage, stop.name)  # one stopped in Optuna's ask, before it began
        stop.others_go_on = workers.others_alive(study)
        if not stop.others_go_on:  # else the study's run stays RUNNING: other workers go on
            tracking.end_killed(client, parent, str(stop))
        raise stop from None
    except BaseException:
        tracking.end_run(client, parent, "FAILED")
        raise
    tracking.clear_fail_reason(client, parent)  # another worker's stop, while this one went on
    tracking.end_run(client, parent, "FINISHED")
    return StudyResult(study=study, tracking_uri=stores.uri, storage=stores.url, parent_run_id=parent)


@dataclass(frozen=True)
class _Stores:
    """A study's stores, checked and opened: MLflow (``uri``), the Optuna study in its storage (``url``),
    whether this worker created it, and the model a study with ``source:`` fine-tunes."""

    client: MlflowClient
    uri: str
    url: str
    storage: workers.HeartbeatStorage
    study: optuna.Study
    created: bool
    source_cfg: ModelConfig | None


def _open_stores(
    spec: StudySpec,
    base: StudyBase,
    base_cfg: ExperimentConfig,
    storage: str | None,
    tracking_uri: str | None,
    where: str,
    on_stale: Callable[[optuna.Study, FrozenTrial], None],
) -> _Stores:
    """Open the study's stores, refusing a source, a search or a definition the stored study does not
    allow. A given storage is checked first (an unreachable one writes nothing); the default SQLite
    file is only created once the MLflow store and the study model's source are known to be good."""
    root = base_cfg.tracking.root
    uri = tracking.resolve_tracking_uri(tracking_uri or base_cfg.tracking.tracking_uri, root)
    study_source.check_store(spec, uri)  # a runs:/ID source in a store not made yet: refused before it is
    rdb = connect_storage(storage, spec.heartbeat, on_stale) if storage else None
    client = tracking.connect(uri)
    study_model_runs.check_source_run(client, spec, uri)
    source_cfg = study_source.source_model(spec, client, uri)  # a study that only fine-tunes: its model
    url = storage or default_storage(root)
    tracking.sqlite_wal(url)
    rdb = rdb or connect_storage(url, spec.heartbeat, on_stale)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # trial failures reach the user as exceptions
    study, created = open_study(spec, rdb, base_cfg.trainer.max_steps, url)
    check_search_space(study, spec, where, url)  # a changed search: which parameter, from what to what
    check_unchanged(study, spec, base, where)  # an edited study is refused before its experiment is touched
    return _Stores(client, uri, url, rdb, study, created, source_cfg)


def _parent_run(spec: StudySpec, stores: _Stores, exp_id: str, tags: dict[str, str]) -> str:
    """The study's MLflow parent run (made by the study's creator with ``tags``, found by other workers)."""
    client = stores.client
    parent = workers.shared_parent(
        stores.study,
        stores.created,
        find=lambda: tracking.find_parent(client, exp_id, spec.name),
        create=lambda: tracking.start_run(
            client,
            exp_id,
            spec.name,
            {tracking.ROLE: "study", tracking.STUDY: spec.name, **tracking.package_tags(), **tags},
        ),
    )
    tracking.set_tags_once(client, parent, tags)
    return parent


def _tidy(spec: StudySpec, stores: _Stores, exp_id: str) -> None:
    """Fail the trials of dead workers (their runs KILLED, the trials retried), end KILLED the runs
    whose trial is no longer running, and queue the grid (its creator)."""
    optuna.storages.fail_stale_trials(stores.study)
    for stale in tracking.stale_running(stores.client, exp_id, spec.name):
        if _trial_state(stores.study, stale) != TrialState.RUNNING:
            tracking.end_killed(stores.client, stale.info.run_id, "worker died; its trial was retried")
    workers.fill_queue(stores.study, spec, stores.created)


def _run_trials(
    place: study_model_runs.StudyPlace,
    study: optuna.Study,
    source_cfg: ModelConfig | None,
    n_trials: int | None,
    keep_going: bool,
) -> None:
    """Train (or find) the study's models, then run ``n_trials`` trials, or until none is left, then
    wait for other workers' trials (a dead one's retry, or a stopped one's trial, is taken here)."""
    spec = place.spec
    study_model = study_model_runs.ensure_study_model(place)
    task_teachers = study_model_runs.ensure_task_teachers(place, study_model)
    objective = trial_objective(place, study_model, task_teachers, source_cfg)
    callbacks = [workers.stop_when_drained(spec)]
    catch: tuple[type[Exception], ...] = (Exception,) if keep_going else (FloatingPointError, workers.DuplicateTrial)
    if n_trials is not None:
        study.optimize(objective, n_trials=n_trials, callbacks=callbacks, catch=catch)
        return
    while True:  # n_trials = what is left now; the callback stops when drained
        if left := _count_left(study, spec):
            study.optimize(objective, n_trials=left, callbacks=callbacks, catch=catch)
        retries = workers.wait_for_others(study, place.poll_s, _CONSOLE.print)
        if not (workers.requeue_interrupted(study, spec) or retries):  # a stopped worker's trials are taken here
            return


def _count_left(study: optuna.Study, spec: StudySpec) -> int:
    """Configurations left for this worker to take: queued trials, and (not grid) trials short of the total."""
    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    if spec.sampler == "grid":
        return waiting
    return max(waiting, spec.total_trials() - sum(t.state in DONE for t in trials))


def _trial_state(study: optuna.Study, run: Run) -> TrialState | None:
    number = run.data.tags.get(tracking.TRIAL)
    trials = study.get_trials(deepcopy=False)
    return trials[int(number)].state if number is not None and number.isdigit() and int(number) < len(trials) else None


def trial_objective(
    place: study_model_runs.StudyPlace,
    study_model: str | None,
    task_teachers: dict[int, str] | None = None,
    source_cfg: ModelConfig | None = None,
) -> Callable[[optuna.Trial], float]:
    """The Optuna objective: train the sampled config as an MLflow run nested under the study's parent
    (from ``study_model``, the study's model, when given: distilled from it, pruning it or quantizing
    it; each fine-tuning task distilled from its ``task_teachers`` entry) and return the metric the
    study optimizes (a study with ``source:``: its trials fine-tune that model, whose architecture is
    ``source_cfg``, on the tasks): :class:`~ablate.sweeps.trial.StudyTrial`. A guarded study's guard
    starts here."""
    return TrialInputs.start(place, study_model, task_teachers or {}, source_cfg).objective
