"""Run a study: an Optuna study whose trials are MLflow runs nested under one parent run.

Optuna's storage (SQLite by default, PostgreSQL for many workers) is the coordinator and
makes the study resumable: running the same command again continues it, retrying trials
that failed or were interrupted and counting each finished configuration once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState
from optuna_integration import PyTorchLightningPruningCallback

from lightning_modules.config import ExperimentConfig, build_config
from lightning_modules.errors import StorageError
from sweeps import tracking
from sweeps.runner import run_name, train
from datamodules.pretrain import PretrainDataModule
from sweeps.spec import StudySpec, corner_configs, trial_config

DONE = (TrialState.COMPLETE, TrialState.PRUNED)


class StepPruningCallback(PyTorchLightningPruningCallback):
    """optuna-integration's Lightning pruning callback, reporting at the optimizer step.

    The library reports each validation at ``current_epoch``; ablate trains one endless
    epoch of a stream and validates every ``trainer.val_every`` steps, so every report
    would land on step 0. Everything else (DDP included) is the library's own code.
    """

    @dataclass
    class _AtStep:
        current_epoch: int  # the only attribute the library's callback reads from the module

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_validation_end(trainer, self._AtStep(trainer.global_step))


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


def open_study(spec: StudySpec, storage: str, max_steps: int) -> optuna.Study:
    """Create or load the Optuna study (StorageError naming the URL if unreachable)."""
    samplers = {
        "grid": lambda: optuna.samplers.GridSampler(spec.grid(), seed=0),
        "tpe": lambda: optuna.samplers.TPESampler(seed=0),
        "random": lambda: optuna.samplers.RandomSampler(seed=0),
    }
    try:
        return optuna.create_study(study_name=spec.name, storage=storage, sampler=samplers[spec.sampler](),
                                   pruner=spec.pruner.build(max_steps), direction=spec.objective.direction,
                                   load_if_exists=True)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors vary by backend
        raise StorageError(f"--storage {storage}: cannot open the Optuna study ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200]})") from None


def requeue_unfinished(study: optuna.Study, spec: StudySpec) -> int:
    """Enqueue grid points whose trials failed or were interrupted and never finished since."""
    if spec.sampler != "grid":
        return 0
    trials = study.get_trials(deepcopy=False)
    done = {tuple(sorted(t.params.items())) for t in trials if t.state in DONE}
    waiting = {tuple(sorted(t.params.items())) for t in trials if t.state == TrialState.WAITING}
    failed = {tuple(sorted(t.params.items())) for t in trials if t.state == TrialState.FAIL and t.params}
    for params in sorted(failed - done - waiting, key=str):
        study.enqueue_trial(dict(params))
    return len(failed - done - waiting)


def preflight(spec: StudySpec, base: dict[str, Any]) -> None:
    """Check every corpus the study reads and train (or load) its tokenizers before anything is
    written, so that a missing or empty corpus fails with nothing half-created."""
    seen = set()
    for cfg in corner_configs(spec, base):
        key = (cfg.data, cfg.model.vocab_size)
        if key not in seen:
            seen.add(key)
            PretrainDataModule(cfg.data, cfg.objective, cfg.model.vocab_size, cfg.seed).prepare_data()


def run_study(spec: StudySpec, base: dict[str, Any], *, storage: str | None = None,
              tracking_uri: str | None = None, n_trials: int | None = None) -> StudyResult:
    """Run the study until ``n_trials`` (default: the whole study) more trials are done."""
    base_cfg: ExperimentConfig = build_config(base, {**spec.overrides, "name": spec.name})
    preflight(spec, base)
    root = base_cfg.tracking.root
    uri = tracking.resolve_tracking_uri(tracking_uri or base_cfg.tracking.tracking_uri, root)
    client = tracking.connect(uri)
    storage = storage or default_storage(root)
    tracking.sqlite_wal(storage)
    study = open_study(spec, storage, base_cfg.trainer.max_steps)

    exp_id = tracking.experiment_id(client, spec.name, uri)
    for stale in tracking.stale_running(client, exp_id, spec.name):  # left by a killed worker
        tracking.end_run(client, stale.info.run_id, "KILLED")
    parent = tracking.find_parent(client, exp_id, spec.name) or tracking.start_run(
        client, exp_id, spec.name, {tracking.ROLE: "study", tracking.STUDY: spec.name, **tracking.package_tags()})
    client.set_tag(parent, "ablate.storage", storage)

    total = spec.total_trials()
    done = sum(t.state in DONE for t in study.get_trials(deepcopy=False))
    requeue_unfinished(study, spec)
    todo = max(0, total - done) if n_trials is None else n_trials

    def objective(trial: optuna.Trial) -> float:
        params = {name: space.suggest(trial, name) for name, space in spec.space.items()}
        cfg = trial_config(base, spec, params)
        tags = {tracking.ROLE: "trial", tracking.STUDY: spec.name, tracking.TRIAL: str(trial.number)}
        pruning = StepPruningCallback(trial, monitor=spec.objective.metric)
        run_tags = {**tags, tracking.STATE: "RUNNING"}
        try:
            result = train(cfg, tracking_uri=uri, experiment=spec.name, parent_run_id=parent, tags=run_tags,
                           name=run_name(params), callbacks=[pruning],
                           extra_params={"variant": params["variant"]} if "variant" in params else None)
        except optuna.TrialPruned:
            _tag_last_run(client, exp_id, spec.name, trial, "PRUNED")
            raise
        except BaseException:
            _tag_last_run(client, exp_id, spec.name, trial, "FAIL")
            raise
        trial.set_user_attr("mlflow_run_id", result.run_id)
        client.set_tag(result.run_id, tracking.STATE, "COMPLETE")
        if spec.objective.metric not in result.metrics:
            raise KeyError(f"objective.metric: {spec.objective.metric!r} was not logged; "
                           f"logged: {', '.join(sorted(result.metrics))}")
        return result.metrics[spec.objective.metric]

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # trial failures reach the user as exceptions
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    client.update_run(parent, status="RUNNING")
    try:
        if todo:
            study.optimize(objective, n_trials=todo, show_progress_bar=True, catch=(FloatingPointError,),
                           callbacks=[MaxTrialsCallback(total, states=DONE)])
    except KeyboardInterrupt:
        tracking.end_run(client, parent, "KILLED")
        raise
    except BaseException:
        tracking.end_run(client, parent, "FAILED")
        raise
    tracking.end_run(client, parent, "FINISHED")
    return StudyResult(study=study, tracking_uri=uri, storage=storage, parent_run_id=parent)


def _tag_last_run(client: Any, exp_id: str, study: str, trial: optuna.Trial, state: str) -> None:
    """Record the Optuna outcome on the trial's MLflow run (if the run was created)."""
    runs = client.search_runs([exp_id], filter_string=(
        f"tags.`{tracking.STUDY}` = '{study}' and tags.`{tracking.TRIAL}` = '{trial.number}'"),
        order_by=["attributes.start_time DESC"], max_results=1)
    if runs:
        client.set_tag(runs[0].info.run_id, tracking.STATE, state)
        trial.set_user_attr("mlflow_run_id", runs[0].info.run_id)

