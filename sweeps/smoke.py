"""``ablate sweep smoke STUDY``: the whole study, every arm, task, teacher and phase, for a handful of
steps on a little data, with the study's own model shapes, in a store of its own
(``<tracking.root>/smoke/<study>/``): every step count scaled by one factor (:data:`RULES`) so that
its longest phase takes about :data:`STEPS` steps (docs/studies.md, "Checking a study, and its smoke run")."""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from ablate.lightning_modules.config.distill import schedule
from ablate.lightning_modules.config.errors import ConfigError, FieldError
from ablate.lightning_modules.config.experiment import flatten
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.yamlio import Json
from ablate.sweeps.base import StudyBase
from ablate.sweeps.optuna_spec import PrunerSpec
from ablate.sweeps.spec import StudySpec, corner_trials, validate_study
from ablate.sweeps.study_models import PLACEHOLDER_SOURCE, FinetuneTask, StudyModel

STEPS = 4
"""About how many steps the longest training phase of a smoke study takes."""
Rule = Callable[[Json, float], Json]
"""A field's smoke value from its value and the study's step factor."""


def _steps(value: Json, k: float) -> Json:
    """A step count scaled by ``k`` (at least 1; 0 stays 0: a phase that is off stays off)."""
    return max(1, math.ceil(value * k)) if isinstance(value, int) and value > 0 else value


def _at_most(n: int) -> Rule:
    """The value, at most ``n`` (None, which means all of it, becomes ``n``)."""
    return lambda value, k: n if value is None else min(cast(int, value), n)  # a count


RULES: Mapping[str, Rule] = {
    "trainer.max_steps": _steps,
    "trainer.val_every": _steps,
    "trainer.val_batches": _at_most(1),
    "trainer.measure": lambda value, k: False,  # latency and memory: of a model a few steps old, meaningless
    "trainer.probe_batches": _at_most(4),
    "optim.warmup_steps": _steps,
    "distill.stage_steps": _steps,
    "prune.gate_steps": _steps,
    "prune.finetune_steps": _steps,
    "quant.qat_steps": _steps,
    "quant.calib_batches": _at_most(1),
    "quant.hessian_iters": _at_most(3),
    "data.tokenizer_docs": _at_most(300),
    "data.batch_size": _at_most(8),
    "data.shuffle_buffer": _at_most(64),
    "data.num_workers": lambda value, k: 0,  # a few batches: loader processes would cost more than they read
    "finetune.max_steps": _steps,
    "finetune.val_every": _steps,
    "finetune.exit_steps": _steps,
    "finetune.train_examples": _at_most(64),
    "finetune.validation_examples": _at_most(32),
    "finetune.batch_size": _at_most(8),
    "finetune.augment_copies": _at_most(1),
    "prune.rounds": _at_most(2),
}
"""The fields a smoke study changes, and how (a model's shape is never among them)."""


def _changes(values: Mapping[str, Json], k: float) -> dict[str, Json]:
    """Dotted changes (a study's overrides, a variant's) with :data:`RULES` applied."""
    return {key: RULES[key](value, k) if key in RULES else value for key, value in values.items()}


ALWAYS = ("trainer", "optim", "data")
"""The sections every run reads: their defaults are scaled too (a method's section only where it is set)."""


def _base(base: StudyBase, k: float) -> StudyBase:
    """The base with :data:`RULES` applied to what it sets, and to the defaults it leaves in
    the sections every run reads (a method's section is scaled where the base sets it: its fields are
    refused in a run that does not use it)."""
    defaults = cast(dict[str, Json], flatten(build_config({})))  # a config's values: plain data
    changes: dict[str, Json] = {}
    for key, rule in RULES.items():
        section, _, name = key.partition(".")
        given = base.section(section)
        if name in given or section in ALWAYS:
            changes[key] = rule(given.get(name, defaults[key]), k)
    return base.changed(changes)


def _task(task: FinetuneTask, k: float) -> FinetuneTask:
    """A fine-tuning task with :data:`RULES` applied (its ``distill`` stages too), at its first seed only
    (four tasks of three seeds would be twelve fine-tunings per trial; the seeds' mean and spread are
    tested apart)."""
    fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    changed: dict[str, Any] = {  # validated by FinetuneTask
        name: RULES[f"finetune.{name}"](value, k) for name, value in fields.items() if f"finetune.{name}" in RULES
    }
    distill = dict(task.distill) if task.distill is not None else None
    if distill is not None:
        distill["stage_steps"] = _steps(distill.get("stage_steps", 100), k)
    seeds = task.seeds[:1] if task.seeds is not None else None
    return dataclasses.replace(task, **changed, distill=distill, seeds=seeds)


M = TypeVar("M", bound=StudyModel)


def _model(section: M | None, k: float) -> M | None:
    """A study model's section (teacher, prune_source, reference) with its overrides scaled."""
    return None if section is None else dataclasses.replace(section, overrides=_changes(section.overrides, k))


def scaled(spec: StudySpec, base: StudyBase, k: float, root: Path) -> tuple[StudySpec, StudyBase]:
    """``spec`` and ``base`` with every step count scaled by ``k`` and the data cut (:data:`RULES`),
    the first seed only, no pruner, its runs under ``root``."""
    smoke_base = _base(base, k).changed({"tracking.root": str(root)})
    search = {
        key: dataclasses.replace(space, choices=list(dict.fromkeys(RULES[key](c, k) for c in space.choices)))
        if key in RULES and space.choices is not None
        else space
        for key, space in spec.search.items()
    }
    n_trials = min(spec.n_trials, max(2, len(spec.variants))) if spec.n_trials is not None else None
    smoke = dataclasses.replace(
        spec,
        base=smoke_base.tree,
        overrides=_changes(spec.overrides, k),
        search=search,
        variants={name: _changes(changes, k) for name, changes in spec.variants.items()},
        seeds=spec.seeds[:1],
        tasks=[_task(t, k) for t in spec.tasks],
        pruner=PrunerSpec(type="none"),
        checkpoints=None,
        n_trials=n_trials,
        teacher=_model(spec.teacher, k),
        prune_source=_model(spec.prune_source, k),
        reference=_model(spec.reference, k),
    )
    return smoke, smoke_base


def _longest(spec: StudySpec, base: StudyBase) -> int:
    """The most training steps any run of the study takes (its trials', its study model's)."""
    default: int = build_config({}).trainer.max_steps
    found = [int(cast(int, base.section("trainer").get("max_steps", default)))]  # a count: the base is validated
    model = [spec.study_model.overrides] if spec.study_model is not None else []
    for changes in (spec.overrides, *spec.variants.values(), *model):
        if isinstance(changes.get("trainer.max_steps"), int):
            found.append(changes["trainer.max_steps"])
    space = spec.search.get("trainer.max_steps")
    if space is not None and space.choices:
        found += [c for c in space.choices if isinstance(c, int)]
    return max(found)


def _check_task_schedules(spec: StudySpec, base: StudyBase) -> None:
    """A task that distils in stages still has steps for each stage and for the prediction layer."""
    for params, cfg in corner_trials(spec, base):
        for task in spec.tasks:
            if not task.runs_for(params.get("variant")) or task.distill is None:
                continue
            ft = task.config(cfg, PLACEHOLDER_SOURCE, teacher=PLACEHOLDER_SOURCE)
            try:
                schedule(ft.distill, cfg.model.num_layers, ft.finetune.max_steps, "finetune.max_steps")
            except FieldError as exc:
                raise ConfigError(str(exc)) from None


def smoke_study(spec: StudySpec, base: StudyBase, root: Path, where: str) -> tuple[StudySpec, StudyBase]:
    """The smoke study of ``spec`` (runs under ``root``): steps scaled to about :data:`STEPS` for its longest
    phase, doubled until every schedule of the study is valid again (at most the study's own)."""
    longest = _longest(spec, base)
    target = STEPS
    while True:
        k = min(1.0, target / longest)
        smoke, tree = scaled(spec, base, k, root)
        try:
            validate_study(smoke, tree, where)
            _check_task_schedules(smoke, tree)
            return smoke, tree
        except ConfigError:
            if k >= 1.0:
                raise
            target *= 2


@dataclass(frozen=True)
class Place:
    """Where a smoke study's runs go: its folder and the stores in it."""

    folder: Path

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.folder.resolve() / 'mlflow.db'}"

    @property
    def storage(self) -> str:
        return f"sqlite:///{self.folder.resolve() / 'optuna.db'}"

    @classmethod
    def of(cls, spec: StudySpec, base: StudyBase) -> Place:
        """``<tracking.root>/smoke/<study>``: the study's own root (``ablate-runs`` by default)."""
        root = build_config({"tracking": base.section("tracking")}).tracking.root
        return cls(Path(root) / "smoke" / spec.name)

    def fresh(self) -> None:
        """An empty folder: an earlier smoke's runs go (a smoke never resumes)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)


def run_smoke(spec: StudySpec, base: StudyBase, where: str) -> int:
    """Run the smoke study of ``spec`` to its end (every trial, whatever fails) and say how each run
    ended; 0 when every run finished, else 1."""
    from mlflow.tracking import MlflowClient

    from ablate.sweeps.engine.context import say
    from ablate.sweeps.study import run_study

    place = Place.of(spec, base)
    smoke, tree = smoke_study(spec, base, place.folder, where)
    place.fresh()
    steps = build_config({"trainer": tree.section("trainer")}).trainer.max_steps
    say(f"smoke of study {spec.name}: every arm, task and phase, {steps} pre-training steps a run, in {place.folder}")
    failure = None
    try:
        run_study(smoke, tree, storage=place.storage, tracking_uri=place.tracking_uri, where=where, keep_going=True)
    except Exception as exc:  # noqa: BLE001 - a study model or a teacher that fails stops the study: said below
        failure = f"{type(exc).__name__}: {exc}"
    client = MlflowClient(place.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([exp.experiment_id]) if exp is not None else []
    runs = [r for r in runs if r.data.tags.get("ablate.role") != "study"]
    bad = [r for r in runs if r.info.status != "FINISHED"]
    sys.stderr.flush()
    print(flush=True)  # a line of its own after the runs' progress bars
    for run in bad:
        reason = run.data.tags.get("ablate.fail_reason", "no reason recorded")
        print(f"  {run.info.status} {run.info.run_name}: {reason}")
    if failure is not None:
        print(f"  the study stopped: {failure}")
    ok = not bad and failure is None
    state = "every run finished" if ok else f"{len(bad)} of {len(runs)} runs did not finish"
    print(f"smoke of study {spec.name}: {len(runs)} runs; {state} (MLflow store {place.tracking_uri})")
    return 0 if ok else 1
