"""Run a study: an Optuna study whose trials are MLflow runs nested under one parent run.

Optuna's storage (SQLite by default, PostgreSQL for many workers) is the coordinator and
makes the study resumable: running the same command again continues it, retrying trials
that failed or were interrupted and counting each finished configuration once.

A study with a model of its own (a ``teacher`` every trial distils from, a ``prune_source`` every
trial prunes, a ``reference`` every trial compresses) uses a given source, or a model trained once
for the study (a run nested under the parent, reused by later invocations while its config is
unchanged): :mod:`~ablate.sweeps.study_model_runs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from optuna_integration import PyTorchLightningPruningCallback
from rich.console import Console

from ablate.datamodules.catalog import active_catalog
from ablate.datamodules.pretrain import PretrainDataModule
from ablate.datamodules.tokenizer import run_vocab_size
from ablate.lightning_modules.config.errors import ConfigError, StorageError, require_driver
from ablate.lightning_modules.config.model import ModelConfig
from ablate.sweeps import attempts, guard, study_model_runs, study_source, workers
from ablate.sweeps.chain import chained_trial
from ablate.sweeps.definition import check_unchanged
from ablate.sweeps.engine import checkpoints, tracking
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.interrupt import as_interrupted
from ablate.sweeps.engine.runner import run_name, train
from ablate.sweeps.engine.weights import RUNS
from ablate.sweeps.search_changes import check_search_space
from ablate.sweeps.spec import StudySpec, corner_configs, study_model_config, trial_config

DONE = workers.DONE
FAIL_REASON = tracking.FAIL_REASON
INTERRUPTED = "ablate.interrupted"  # user attr of a trial a signal stopped (Optuna's state: FAIL): the signal
_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)  # what the study does besides its trials


class StepPruningCallback(PyTorchLightningPruningCallback):  # type: ignore[misc]  # optuna-integration: no type hints
    """optuna-integration's Lightning pruning callback, reporting at the optimizer step.

    The library reports each validation at ``current_epoch``; ablate trains one endless
    epoch of a stream and validates every ``trainer.val_every`` steps, so every report
    would land on step 0; a run's later phases report at the run's steps (its logger's offset).
    Everything else (DDP included) is the library's own code.
    """

    @dataclass
    class _AtStep:
        current_epoch: int  # the only attribute the library's callback reads from the module

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        # the run's step: a later phase's fit goes on from the steps of the phases before it
        step = trainer.global_step + getattr(trainer.logger, "offset", 0)
        super().on_validation_end(trainer, self._AtStep(step))


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


def connect_storage(url: str, heartbeat: int, on_stale: Callable[[optuna.Study, FrozenTrial], None]) -> Any:
    """The Optuna RDB storage at ``url``, with heartbeats (StorageError naming the URL if unreachable)."""
    require_driver(url)  # postgresql:// without psycopg: one line naming the extra
    try:
        return workers.storage(url, heartbeat, on_stale)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors vary by backend
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise StorageError(
            f"--storage {tracking.redact(url)}: cannot open the Optuna storage ({type(exc).__name__}: {first})"
        ) from None


def preflight(spec: StudySpec, base: dict[str, Any]) -> None:
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
    base: dict[str, Any],
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
    root = base_cfg.tracking.root
    uri = tracking.resolve_tracking_uri(tracking_uri or base_cfg.tracking.tracking_uri, root)
    killed: list[Callable[[optuna.Study, FrozenTrial], None]] = []  # set once the MLflow experiment is known
    on_stale = workers.retry_stale(lambda study, trial: killed[0](study, trial))
    # a given storage is checked first (an unreachable one writes nothing); the default SQLite
    # file is only created once the MLflow store and the study model's source are known to be good
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
    exp_id = tracking.experiment_id(client, spec.name, uri)
    killed.append(study_model_runs.on_stale(client, exp_id, spec.name, workers.mark_killed(client, exp_id, spec.name)))
    parent = workers.shared_parent(
        study,
        created,
        find=lambda: tracking.find_parent(client, exp_id, spec.name),
        create=lambda: tracking.start_run(
            client, exp_id, spec.name, {tracking.ROLE: "study", tracking.STUDY: spec.name, **tracking.package_tags()}
        ),
    )
    for key, value in {"ablate.storage": tracking.redact(url), **(tags or {})}.items():
        client.set_tag(parent, key, value)
    optuna.storages.fail_stale_trials(study)  # trials of dead workers: KILLED in MLflow, retried
    for stale in tracking.stale_running(client, exp_id, spec.name):  # runs whose trial is no longer running
        if _trial_state(study, stale) != TrialState.RUNNING:
            tracking.end_killed(client, stale.info.run_id, "worker died; its trial was retried")
    workers.fill_queue(study, spec, created)

    client.update_run(parent, status="RUNNING")
    try:  # the study model's training, too, ends the parent FAILED or KILLED if it fails or is interrupted
        if _count_left(study, spec) or workers.others_running(study):
            poll_s = min(5.0, spec.heartbeat)
            place = study_model_runs.StudyPlace(spec, base, client, exp_id, uri, parent, rdb, poll_s, hooks)
            study_model = study_model_runs.ensure_study_model(place)
            task_teachers = study_model_runs.ensure_task_teachers(place, study_model)
            objective = trial_objective(place, study_model, task_teachers, source_cfg)
            callbacks = [workers.stop_when_drained(spec)]
            catch: tuple[type[Exception], ...] = (
                (Exception,) if keep_going else (FloatingPointError, workers.DuplicateTrial)
            )
            if n_trials is not None:
                study.optimize(objective, n_trials=n_trials, callbacks=callbacks, catch=catch)
            else:  # n_trials = what is left now; the callback stops when drained
                while True:  # then wait for other workers' trials; a dead one's retry is taken here
                    if left := _count_left(study, spec):
                        study.optimize(objective, n_trials=left, callbacks=callbacks, catch=catch)
                    if not workers.wait_for_others(study, min(5.0, spec.heartbeat), _CONSOLE.print):
                        break
    except (KeyboardInterrupt, SystemExit) as exc:  # SIGINT, SIGTERM: the trial's runs are KILLED already
        stop = as_interrupted(exc)
        tracking.end_killed(client, parent, str(stop))
        raise stop from None
    except BaseException:
        tracking.end_run(client, parent, "FAILED")
        raise
    tracking.end_run(client, parent, "FINISHED")
    return StudyResult(study=study, tracking_uri=uri, storage=url, parent_run_id=parent)


def _count_left(study: optuna.Study, spec: StudySpec) -> int:
    """Configurations left for this worker to take: queued trials, and (not grid) trials short of the total."""
    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    if spec.sampler == "grid":
        return waiting
    return max(waiting, spec.total_trials() - sum(t.state in DONE for t in trials))


def _trial_state(study: optuna.Study, run: Any) -> TrialState | None:
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
    ``source_cfg``, on the tasks). Each trial says its number, configuration and, when it ends, its time; a retry of
    a stopped attempt that left a checkpoint goes on in that attempt's run."""
    spec, client, exp_id, uri = place.spec, place.client, place.exp_id, place.uri
    guarded = guard.start_guard(spec, client, place.parent, study_model, task_teachers or {})
    if guarded is not None:
        _CONSOLE.print(f"guard: {guarded.said()}", markup=False)

    def objective(trial: optuna.Trial) -> float:
        params = {name: space.suggest(trial, name) for name, space in spec.space.items()}
        try:
            workers.claim(trial.study, trial, params)  # lost a race for this configuration: no run, FAIL
        except workers.DuplicateTrial as exc:
            trial.set_user_attr(FAIL_REASON, str(exc))
            raise
        if (kept := _finished_earlier(place, trial)) is not None:
            if guarded is not None:  # its run's guard, recorded on this trial
                run_id = trial.user_attrs["mlflow_run_id"]
                guarded.record(trial, client, run_id, client.get_run(run_id).data.metrics)
            return kept
        cfg = trial_config(place.base, spec, params, study_model)
        if source_cfg is not None:  # the trial's params say the model its tasks fine-tune
            cfg = replace(cfg, model=source_cfg)
        tags = {
            tracking.ROLE: "trial",
            tracking.STUDY: spec.name,
            tracking.TRIAL: str(trial.number),
            tracking.WORKER: tracking.worker_id(),
        }
        if study_model is not None:  # its teacher only where the trial distils from it
            tags |= study_model_runs.model_tags(study_model, teaches=cfg.distill.teacher == study_model)
        pruning = StepPruningCallback(trial, monitor=spec.optimize.metric)
        where = checkpoints.location(spec.checkpoints, uri, cfg.tracking.root)
        ckpt = checkpoints.trial_plan(where, cfg.tracking.root, spec.name, cfg)
        variant = params.get("variant")
        mine = [i for i, task in enumerate(spec.tasks) if task.runs_for(variant)]  # this trial's tasks
        earlier = attempts.stopped_attempt(client, exp_id, ckpt, chained=bool(spec.tasks))
        ctx = RunContext(
            tracking_uri=uri,
            experiment=spec.name,
            parent_run_id=place.parent,
            name=run_name(params),
            tags={**tags, tracking.STATE: "RUNNING"},
            params={"variant": params["variant"]} if "variant" in params else {},
            callbacks=(pruning,),
            checkpoint=ckpt,
            resume=True,
            reopen=earlier,
        ).hooked(place.hooks)
        done = sum(t.state in DONE for t in trial.study.get_trials(deepcopy=False))
        again = f" (going on in run {earlier} from its checkpoint)" if earlier else ""
        _CONSOLE.print(f"trial {trial.number} [{done + 1}/{spec.total_trials()}]: {ctx.name}{again}", markup=False)
        began = time.monotonic()
        try:
            # with fine-tuning tasks: pretrain -> (intrinsic) -> fine-tune, each stage a run nested in the trial's
            teachers_of = {j: (task_teachers or {})[i] for j, i in enumerate(mine) if i in (task_teachers or {})}
            if spec.tasks:
                tasks = [spec.tasks[i] for i in mine]
                result = chained_trial(
                    cfg,
                    tasks,
                    ctx,
                    task_teachers=teachers_of,
                    study_model=study_model,
                    wnli=spec.glue_wnli,
                    source=spec.source,
                )
            else:
                result = train(cfg, ctx)
        except optuna.TrialPruned:
            _tag_last_run(client, exp_id, spec.name, trial, "PRUNED")
            _ended(trial, "PRUNED", began)
            raise
        except (KeyboardInterrupt, SystemExit) as exc:  # SIGINT, SIGTERM: its runs are KILLED; Optuna fails it
            stop = as_interrupted(exc)
            trial.set_user_attr(INTERRUPTED, stop.name)
            _tag_last_run(client, exp_id, spec.name, trial, "INTERRUPTED")  # its reason: the run's own
            _ended(trial, f"interrupted by {stop.name}", began)
            raise stop from None
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}"[:500]
            _tag_last_run(client, exp_id, spec.name, trial, "FAIL", reason)
            _ended(trial, "FAILED", began)
            raise
        trial.set_user_attr("mlflow_run_id", result.run_id)
        client.set_tag(result.run_id, tracking.STATE, "COMPLETE")
        metrics = result.metrics
        if spec.optimize.metric not in metrics:  # a model's accounting (params.*, model_bytes) is logged at its start
            metrics = {**client.get_run(result.run_id).data.metrics, **metrics}
        if spec.optimize.metric not in metrics:
            raise KeyError(
                f"optimize.metric: {spec.optimize.metric!r} was not logged; logged: {', '.join(sorted(metrics))}"
            )
        value = metrics[spec.optimize.metric]
        said = ""
        if guarded is not None:  # the trial's constraint: within the bound or not
            logged = metrics if guarded.guard.metric in metrics else client.get_run(result.run_id).data.metrics
            verdict = guarded.record(trial, client, result.run_id, {**logged, **metrics})
            said = f", {guarded.guard.metric} {verdict.value:.4g} {'within' if verdict.met else 'past'} the bound"
        _ended(trial, f"COMPLETE, {spec.optimize.metric} {value:.4g}{said}", began)
        return value

    return objective


def _finished_earlier(place: study_model_runs.StudyPlace, trial: optuna.Trial) -> float | None:
    """The value of a retried trial whose dead attempt's run had FINISHED (its worker killed before
    Optuna recorded it): the run is tagged as this trial's and COMPLETE, and nothing trains again."""
    history = workers.retry_history(trial)
    found = attempts.finished_attempt(place.client, place.exp_id, place.spec.name, history, place.spec.optimize.metric)
    if found is None:
        return None
    run_id, value = found
    place.client.set_tag(run_id, tracking.TRIAL, str(trial.number))
    place.client.set_tag(run_id, tracking.STATE, "COMPLETE")
    place.client.set_tag(run_id, attempts.FINISHED_BEFORE, str(history[-1]))
    trial.set_user_attr("mlflow_run_id", run_id)
    _CONSOLE.print(
        f"trial {trial.number}: COMPLETE, {place.spec.optimize.metric} {value:.4g}: the run of trial "
        f"{history[-1]} had finished before its worker died ({run_id})",
        markup=False,
    )
    return value


def _ended(trial: optuna.Trial, how: str, began: float) -> None:
    """The line that says how a trial ended and how long it took."""
    _CONSOLE.print(f"trial {trial.number}: {how} after {_took(time.monotonic() - began)}", markup=False)


def _took(seconds: float) -> str:
    """``41.2 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes} min {sec:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _tag_last_run(
    client: Any, exp_id: str, study: str, trial: optuna.Trial, state: str, reason: str | None = None
) -> None:
    """Record the Optuna outcome (and a failure's reason) on the trial and its MLflow run (if created)."""
    if reason is not None:
        trial.set_user_attr(FAIL_REASON, reason)
    runs = client.search_runs(
        [exp_id],
        filter_string=(f"tags.`{tracking.STUDY}` = '{study}' and tags.`{tracking.TRIAL}` = '{trial.number}'"),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if runs:
        client.set_tag(runs[0].info.run_id, tracking.STATE, state)
        if reason is not None:
            client.set_tag(runs[0].info.run_id, FAIL_REASON, reason)
        trial.set_user_attr("mlflow_run_id", runs[0].info.run_id)
