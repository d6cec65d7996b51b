"""The runs of a study's model (its ``teacher``, ``prune_source`` or ``reference``): a given one
(``.source``) or one trained once for the study (``.model``), however many workers start together,
through a small Optuna study beside the study's own; and its task teachers (the study model
fine-tuned once on each task that distils from it). docs/many-machines.md, "Workers that die"."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna
from mlflow.exceptions import MlflowException
from optuna.trial import TrialState
from rich.console import Console

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig, config_digest, to_dict
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps import workers
from ablate.sweeps.base import StudyBase
from ablate.sweeps.engine import checkpoints, tracking
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.weights import RUNS
from ablate.sweeps.spec import StudySpec, corner_configs, study_model_config

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

CONFIG_DIGEST = "ablate.config_digest"  # on a run a study trains once: sha256 of its resolved config YAML
OLD_CONFIG_DIGEST = "ablate.teacher_config"  # the same, as stores written before the rename have it
ROLES = ("teacher", "prune_source", "reference")  # the roles of the runs a study trains once (old: all teacher)
TASK_TEACHER = "teacher"  # the role of a task teacher's run
SUFFIX = ":trained-once"  # the Optuna study that hands the training of a model to one worker
_DIGEST = "config_digest"  # user attr of a trial of that study: the config it trains
_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)


def source_tag(source: str) -> str:
    """A source as a run's tag says it: the run id of ``runs:/RUN_ID``, else the folder."""
    return source.removeprefix(RUNS).strip("/") if source.startswith(RUNS) else source


def model_tags(source: str, teaches: bool) -> dict[str, str]:
    """The tags of a run that uses the study's model ``source`` (the study's parent, a trial):
    ``ablate.study_model_run``, and ``ablate.teacher_run`` where the model is its distillation
    teacher (``teaches``)."""
    run = source_tag(source)
    return {tracking.STUDY_MODEL: run, **({tracking.TEACHER: run} if teaches else {})}


def check_source_run(client: MlflowClient, spec: StudySpec, uri: str) -> None:
    """A study model's ``.source`` given as ``runs:/RUN_ID`` must be a finished run of this MLflow
    store (checked before the study writes anything)."""
    study_model = spec.study_model
    if study_model is None or study_model.source is None or not study_model.source.startswith(RUNS):
        return
    source, key = study_model.source, f"{study_model.SECTION}.source"
    try:
        status = client.get_run(source_tag(source)).info.status
    except MlflowException:
        raise ConfigError(f"{key}: {source}: no such run in {uri}") from None
    if status != "FINISHED":
        raise ConfigError(f"{key}: {source}: the run is {status}, not FINISHED")


@dataclass(frozen=True)
class StudyPlace:
    """Where a study trains the models it trains once: its spec and base config, the MLflow store
    (client, experiment, URI, the study's parent run), the Optuna storage that hands each training
    to one worker, and how often a waiting worker looks again."""

    spec: StudySpec
    base: StudyBase
    client: MlflowClient
    exp_id: str
    uri: str
    parent: str
    storage: str | optuna.storages.BaseStorage
    poll_s: float = 5.0
    hooks: RunContext = RunContext()  # what every run it starts gets besides its own (a benchmark's clocks)


def ensure_study_model(place: StudyPlace) -> str | None:
    """The study's model as the trials' source string (``distill.teacher``, ``prune.source`` or
    ``quant.source``); None: the study has none.

    ``.source`` is used as is; ``.model`` is trained once for the study (or found, trained
    earlier with the same config). Tags ``parent`` with it (:func:`model_tags`).
    """
    spec = place.spec
    study_model = spec.study_model
    if study_model is None:
        return None
    section = study_model.SECTION
    if study_model.source is not None:
        source = study_model.source
        _CONSOLE.print(f"{section}: {source} ({section}.source)", markup=False)
    else:
        assert study_model.model is not None
        cfg = study_model_config(place.base, spec)
        what = str(study_model.model.get("preset", "its model"))
        source = RUNS + trained_once(place, cfg, section, section, SUFFIX, what)
    tracking.set_tags_once(place.client, place.parent, model_tags(source, teaches=spec.teacher is not None))
    return source


def _search(client: MlflowClient, exp_id: str, study_name: str, condition: str) -> list[Run]:
    """The runs a study trains once (any of :data:`ROLES`) that meet ``condition``."""
    found: list[Run] = []
    for role in ROLES:
        found += client.search_runs(
            [exp_id],
            filter_string=(
                f"tags.`{tracking.ROLE}` = '{role}' and tags.`{tracking.STUDY}` = '{study_name}' and {condition}"
            ),
        )
    return found


def mark_killed(client: MlflowClient, exp_id: str, study_name: str) -> None:
    """End the RUNNING run(s) of the models a study trains once KILLED: their worker died."""
    for run in _search(client, exp_id, study_name, "attributes.status = 'RUNNING'"):
        tracking.end_killed(client, run.info.run_id)


def _finished(client: MlflowClient, exp_id: str, study_name: str, digest: str) -> str | None:
    for tag in (CONFIG_DIGEST, OLD_CONFIG_DIGEST):
        found = client.search_runs(
            [exp_id],
            filter_string=(
                f"tags.`{tracking.STUDY}` = '{study_name}' and tags.`{tag}` = '{digest}' "
                f"and attributes.status = 'FINISHED'"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if found:
            run_id: str = found[0].info.run_id
            return run_id
    return None


def ensure_task_teachers(place: StudyPlace, study_model: str | None) -> dict[int, str]:
    """For each fine-tuning task that distils from the study's model (``tasks[i].distill`` without
    a teacher): that model (``study_model``) fine-tuned on the task, once for the study (found when
    it was, waited for when another worker fine-tunes it), as ``runs:/RUN_ID`` by task index.
    Tasks with the same data and schedule share one teacher."""
    out: dict[int, str] = {}
    if study_model is None:
        return out
    spec = place.spec
    students = corner_configs(spec, place.base)
    shared: dict[str, str] = {}  # the teacher's fine-tuning, its task's name left out -> its run
    for i, task in enumerate(spec.tasks):
        if not task.study_teacher:
            continue
        teacher_task = task.teacher_task()
        key = repr(dataclasses.replace(teacher_task, task="-"))
        if key in shared:  # the same data and schedule as an earlier task's: the same teacher
            out[i] = shared[key]
            continue
        cfg = teacher_task.config(students[0], study_model)
        cfg = build_config(to_dict(cfg), {"name": f"{spec.name}-teacher-{task.task}"})
        name = f"teacher | {task.task}"
        what = f"the study's model on {task.task}"
        suffix = f"{SUFFIX}:{config_digest(cfg)[:12]}"
        out[i] = shared[key] = RUNS + trained_once(place, cfg, name, TASK_TEACHER, suffix, what)
    return out


def trained_once(place: StudyPlace, cfg: ExperimentConfig, name: str, role: str, suffix: str, what: str) -> str:
    """The run id of a model the study trains once (its model, a task's teacher): the finished run
    with this config, or one trained now by this worker or by another one (waited for). Its run is
    named ``name``, its role ``role``; the Optuna study ``<study><suffix>`` hands its training to one
    worker; its checkpoints go where the study's ``checkpoints`` say."""
    study, client, exp_id, uri = place.spec.name, place.client, place.exp_id, place.uri
    digest = config_digest(cfg)
    if (found := _finished(client, exp_id, study, digest)) is not None:
        _CONSOLE.print(f"{name}: reusing run {found} (trained earlier for this study)", markup=False)
        return found
    helper = optuna.create_study(study_name=study + suffix, storage=place.storage, load_if_exists=True)

    def competing(trial: optuna.Trial) -> list[optuna.trial.FrozenTrial]:
        """Other attempts at this model that come first: finished, or running with a smaller number
        (one that has not said its config yet counts: it may be this one)."""
        return [
            t
            for t in helper.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
            if t.number != trial.number
            and t.user_attrs.get(_DIGEST, digest) == digest
            and (t.state == TrialState.COMPLETE or t.number < trial.number)
        ]

    def train_model(trial: optuna.Trial) -> float:
        trial.set_user_attr(_DIGEST, digest)
        if competing(trial):
            raise workers.DuplicateTrial(f"another worker trains {name}")
        mark_killed(client, exp_id, study)  # a RUNNING run of a model trained once now is a dead attempt's
        steps = cfg.finetune.max_steps if cfg.regime == "finetune" else cfg.trainer.max_steps
        _CONSOLE.print(f"{name}: training {what} once for the study (run '{name}', {steps} steps)", markup=False)
        tags = {tracking.ROLE: role, tracking.STUDY: study, CONFIG_DIGEST: digest}
        where = checkpoints.location(place.spec.checkpoints, uri, cfg.tracking.root)
        ctx = RunContext(
            tracking_uri=uri,
            experiment=study,
            parent_run_id=place.parent,
            name=name,
            tags=tags,
            checkpoint=checkpoints.trial_place(where, cfg.tracking.root, study, cfg),
            resume=True,
        ).hooked(place.hooks)
        result = train(cfg, ctx)
        _CONSOLE.print(f"{name}: trained run {result.run_id}", markup=False)
        return 0.0

    told = False
    while (found := _finished(client, exp_id, study, digest)) is None:
        optuna.storages.fail_stale_trials(helper)  # a dead worker's attempt: KILLED, retried below
        running = [
            t
            for t in helper.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get(_DIGEST, digest) == digest
        ]
        if not running:  # train it here (a failure is raised); a lost race means waiting instead
            helper.optimize(train_model, n_trials=1, catch=(workers.DuplicateTrial,))
            continue
        if not told:
            _CONSOLE.print(f"{name}: another worker is training it; waiting", markup=False)
            told = True
        time.sleep(place.poll_s)
    return found


def on_stale(
    client: MlflowClient, exp_id: str, study_name: str, trial_killed: Callable[[optuna.trial.FrozenTrial], None]
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """What a stale trial of the study or of a helper study ends KILLED: the study's trial run, or
    the run of the model the helper trains once (the study model's, a task teacher's)."""

    def mark(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if study.study_name.startswith(study_name + SUFFIX):
            mark_killed(client, exp_id, study_name)
        else:
            trial_killed(trial)

    return mark
