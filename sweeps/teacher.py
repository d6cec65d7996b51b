"""A study's teacher or model to prune: a given one (``teacher.source``, ``prune_source.source``)
or one trained once for the study (``.model``).

A trained teacher is a run nested under the study's parent, tagged with the sha256 of its
resolved config, and reused while that config is unchanged. However many workers start
together, it is trained once: its training is the one trial of a small Optuna study beside
the study's own (``<study>:teacher``, same storage). Of two workers that start it at once
the lower-numbered trial trains and the other waits for it; the trial has heartbeats, so if
its worker dies it goes stale, its MLflow run ends KILLED and a waiting worker takes over,
resuming from the teacher's last checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from mlflow.exceptions import MlflowException
from optuna.trial import TrialState
from rich.console import Console

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig, config_digest, to_dict
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps import checkpoints, tracking, workers
from ablate.sweeps.context import RunContext
from ablate.sweeps.runner import train
from ablate.sweeps.spec import StudySpec, corner_configs, teacher_config
from ablate.sweeps.weights import RUNS

TEACHER_CONFIG = "ablate.teacher_config"  # on a study's teacher run: sha256 of its resolved config YAML
SUFFIX = ":teacher"  # the Optuna study that hands the teacher's training to one worker
_DIGEST = "teacher_config"  # user attr of a teacher trial: the config it trains
_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)


def teacher_tag(source: str) -> str:
    """The ``ablate.teacher_run`` tag of a teacher source: the run id of ``runs:/RUN_ID``, else the folder."""
    return source.removeprefix(RUNS).strip("/") if source.startswith(RUNS) else source


def check_teacher_run(client: Any, spec: StudySpec, uri: str) -> None:
    """A ``teacher.source`` (``prune_source.source``) ``runs:/RUN_ID`` must be a finished run of
    this MLflow store (checked before the study writes anything)."""
    upstream = spec.upstream
    if upstream is None or upstream.source is None or not upstream.source.startswith(RUNS):
        return
    source, key = upstream.source, f"{upstream.SECTION}.source"
    try:
        status = client.get_run(teacher_tag(source)).info.status
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
    base: dict[str, Any]
    client: Any
    exp_id: str
    uri: str
    parent: str
    storage: Any
    poll_s: float = 5.0


def ensure_teacher(place: StudyPlace) -> str | None:
    """The study's teacher (model to prune) as a ``distill.teacher`` (``prune.source``) string;
    None: the study has neither.

    ``.source`` is used as is; ``.model`` is trained once for the study (or found, trained
    earlier with the same config). Tags ``parent`` with it.
    """
    upstream = place.spec.upstream
    if upstream is None:
        return None
    if upstream.source is not None:
        source = upstream.source
        _CONSOLE.print(f"{upstream.SECTION}: {source} ({upstream.SECTION}.source)", markup=False)
    else:
        assert upstream.model is not None
        cfg = teacher_config(place.base, place.spec)
        what = str(upstream.model.get("preset", "its model"))
        source = RUNS + trained_once(place, cfg, upstream.SECTION, SUFFIX, what)
    place.client.set_tag(place.parent, tracking.TEACHER, teacher_tag(source))
    return source


def mark_killed(client: Any, exp_id: str, study_name: str) -> None:
    """End the RUNNING teacher run(s) of a study KILLED: their worker died."""
    for run in client.search_runs(
        [exp_id],
        filter_string=(
            f"tags.`{tracking.ROLE}` = 'teacher' and tags.`{tracking.STUDY}` = '{study_name}' "
            f"and attributes.status = 'RUNNING'"
        ),
    ):
        tracking.end_killed(client, run.info.run_id)


def _finished(client: Any, exp_id: str, study_name: str, digest: str) -> str | None:
    found = client.search_runs(
        [exp_id],
        filter_string=(
            f"tags.`{tracking.ROLE}` = 'teacher' and tags.`{tracking.STUDY}` = '{study_name}' "
            f"and tags.`{TEACHER_CONFIG}` = '{digest}' and attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return found[0].info.run_id if found else None


def ensure_task_teachers(place: StudyPlace, source: str | None) -> dict[int, str]:
    """For each fine-tuning task that distils from the study's model (``finetune[i].distill`` without
    a teacher): that model (``source``) fine-tuned on the task, once for the study (found when it
    was, waited for when another worker fine-tunes it), as ``runs:/RUN_ID`` by task index.
    Tasks with the same data and schedule share one teacher."""
    out: dict[int, str] = {}
    if source is None:
        return out
    spec = place.spec
    students = corner_configs(spec, place.base)
    shared: dict[str, str] = {}  # the teacher's fine-tuning, its task's name left out -> its run
    for i, task in enumerate(spec.finetune):
        if not task.study_teacher:
            continue
        teacher_task = task.teacher_task()
        key = repr(dataclasses.replace(teacher_task, task="-"))
        if key in shared:  # the same data and schedule as an earlier task's: the same teacher
            out[i] = shared[key]
            continue
        cfg = teacher_task.config(students[0], source)
        cfg = build_config(to_dict(cfg), {"name": f"{spec.name}-teacher-{task.task}"})
        role = f"teacher | {task.task}"
        what = f"the study's model on {task.task}"
        suffix = f"{SUFFIX}:{config_digest(cfg)[:12]}"
        out[i] = shared[key] = RUNS + trained_once(place, cfg, role, suffix, what)
    return out


def trained_once(place: StudyPlace, cfg: ExperimentConfig, name: str, suffix: str, what: str) -> str:
    """The run id of a model the study trains once (a teacher, a model to prune, a task's teacher):
    the finished run with this config, or one trained now by this worker or by another one
    (waited for). Its run is named ``name``; the Optuna study ``<study><suffix>`` hands its
    training to one worker; its checkpoints go where the study's ``checkpoints`` say."""
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

    def train_teacher(trial: optuna.Trial) -> float:
        trial.set_user_attr(_DIGEST, digest)
        if competing(trial):
            raise workers.DuplicateTrial("another worker trains the teacher")
        mark_killed(client, exp_id, study)  # a RUNNING teacher run now is a dead attempt's
        steps = cfg.finetune.max_steps if cfg.regime == "finetune" else cfg.trainer.max_steps
        _CONSOLE.print(f"{name}: training {what} once for the study (run '{name}', {steps} steps)", markup=False)
        tags = {tracking.ROLE: "teacher", tracking.STUDY: study, TEACHER_CONFIG: digest}
        where = checkpoints.location(place.spec.checkpoints, uri, cfg.tracking.root)
        ctx = RunContext(
            tracking_uri=uri,
            experiment=study,
            parent_run_id=place.parent,
            name=name,
            tags=tags,
            checkpoint=checkpoints.trial_plan(where, cfg.tracking.root, study, cfg),
            resume=True,
        )
        result = train(cfg, ctx)
        _CONSOLE.print(f"{name}: trained run {result.run_id}", markup=False)
        return 0.0

    told = False
    while (found := _finished(client, exp_id, study, digest)) is None:
        optuna.storages.fail_stale_trials(helper)  # a dead worker's teacher: KILLED, retried below
        running = [
            t
            for t in helper.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get(_DIGEST, digest) == digest
        ]
        if not running:  # train it here (a failure is raised); a lost race means waiting instead
            helper.optimize(train_teacher, n_trials=1, catch=(workers.DuplicateTrial,))
            continue
        if not told:
            _CONSOLE.print(f"{name}: another worker is training it; waiting", markup=False)
            told = True
        time.sleep(place.poll_s)
    return found


def on_stale(
    client: Any, exp_id: str, study_name: str, trial_killed: Callable[[optuna.trial.FrozenTrial], None]
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """What a stale trial of either study ends KILLED: the study's trial run, or the teacher run."""

    def mark(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if study.study_name.endswith(SUFFIX):
            mark_killed(client, exp_id, study_name)
        else:
            trial_killed(trial)

    return mark
