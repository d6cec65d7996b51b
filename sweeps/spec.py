"""Study specs: a base experiment, a search space over config fields, seeds, the metric to optimize,
sampler, pruner and the report to regenerate; read from YAML and fully validated (every grid point
builds a valid config) before anything runs (:func:`load_study`). Every key, in one commented example:
docs/studies.md, "A study file"."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from optuna.distributions import CategoricalChoiceType
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import (
    STRICT,
    ConfigError,
    FieldError,
    did_you_mean,
    format_error,
    spec_keys,
)
from ablate.lightning_modules.config.experiment import REGIME_SOURCE, ExperimentConfig, field_names, flatten
from ablate.lightning_modules.config.glue import suite
from ablate.lightning_modules.config.load import build_config, read_yaml
from ablate.lightning_modules.config.metric_names import DOWNSTREAM_AVG
from ablate.lightning_modules.config.yamlio import Json
from ablate.sweeps.base import StudyBase
from ablate.sweeps.guard import check_reference
from ablate.sweeps.optuna_spec import OptimizeSpec, ParamSpace, PrunerSpec
from ablate.sweeps.reach import check_search_reaches
from ablate.sweeps.space import culprits, points
from ablate.sweeps.study_models import (
    PLACEHOLDER_SOURCE,
    REFERENCE_FIELDS,
    FinetuneTask,
    PruneSourceSpec,
    ReferenceSpec,
    StudyModel,
    TeacherSpec,
    check_task_variants,
    check_tasks,
)

TOKENIZER_FIELDS = (
    "model.vocab_size",
    "data.corpus",
    "data.text_field",
    "data.val_fraction",
    "data.text_doc_chars",
    "data.lowercase",
    "data.tokenizer_docs",
)
"""What determines the WordPiece tokenizer: the study's model and its trials must agree on all of it."""

Params = dict[str, Json]
"""A trial's parameters: searched dotted fields, ``variant`` and ``seed``, by name."""


@dataclass(frozen=True, config=STRICT)
class StudySpec:
    """A whole study, as declared in YAML."""

    name: str = Field(min_length=1, pattern=r"^[\w.-]+$")
    base: str | dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict)
    search: dict[str, ParamSpace] = Field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    sampler: Literal["grid", "tpe", "random"] = "grid"
    n_trials: int | None = Field(default=None, gt=0)
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    optimize: OptimizeSpec = Field(default_factory=OptimizeSpec)
    report: str | dict[str, Any] | None = None
    teacher: TeacherSpec | None = None
    prune_source: PruneSourceSpec | None = None
    reference: ReferenceSpec | None = None
    glue_wnli: bool = False
    tasks: list[FinetuneTask] = Field(default_factory=list)
    source: str | None = Field(default=None, min_length=1)
    heartbeat: int = Field(default=10, ge=1, le=3600)
    checkpoints: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_study_model(self) -> StudySpec:
        given = [name for name in ("teacher", "prune_source", "reference") if getattr(self, name) is not None]
        if len(given) > 1:
            raise FieldError(f"{given[1]}", "a study has one trained model (teacher, prune_source or reference)")
        check_reference(self.optimize.guard, self.study_model)  # a guard's reference: given, or the study model's
        return self

    @model_validator(mode="after")
    def _source_only_fine_tunes(self) -> StudySpec:
        """A study with a ``source`` fine-tunes that one model on its tasks: nothing is pre-trained,
        searched or compared, so each trial is one seed and it optimizes a task's metric."""
        if self.source is None:
            return self
        for section in ("search", "variants", "teacher", "prune_source", "reference"):
            if getattr(self, section):
                raise FieldError(
                    section,
                    f"a study with source: fine-tunes that one model on its tasks (a trial per seed); "
                    f"{section} needs trials that pre-train: leave out source:",
                )
        if not self.tasks:
            raise FieldError("tasks", "a study with source: fine-tunes it on its tasks; give tasks")
        metric, prefixes = self.optimize.metric, tuple(f"{t.task}/" for t in self.tasks)
        devs = tuple(f"{d.name}/" for t in self.tasks for d in t.extra_validation)
        if not metric.startswith((*prefixes, *devs, "glue/")) and metric != DOWNSTREAM_AVG:
            raise FieldError(
                "optimize",
                f"metric: {metric!r}: a study with source: trains only its tasks; optimize a task's metric "
                f"({prefixes[0]}best_{self.tasks[0].metric}) or {DOWNSTREAM_AVG}",
            )
        return self

    @field_validator("tasks", mode="before")
    @classmethod
    def _suite(cls, value: object, info: ValidationInfo) -> object:
        """``tasks: glue``: every GLUE task (WNLI only with ``glue_wnli``), each with the table's settings."""
        if not isinstance(value, str):
            return value
        if value != "glue":
            raise ValueError(f"{value!r}: give glue (the GLUE benchmark) or a list of tasks")
        return [{"glue": name} for name in suite(wnli=info.data.get("glue_wnli") is True)]

    @property
    def study_model(self) -> StudyModel | None:
        """The study's model, if any: its teacher, prune_source or reference."""
        return self.teacher or self.prune_source or self.reference

    @property
    def set_by_study(self) -> tuple[str, ...]:
        """The trial fields the study's trained model fills."""
        if self.reference is not None:
            return tuple(REFERENCE_FIELDS.values())
        return () if self.study_model is None else (self.study_model.FIELD,)

    @property
    def space(self) -> dict[str, ParamSpace]:
        """The search space, plus ``variant`` (the named arms, if any) and ``seed``."""
        arms = {"variant": ParamSpace(choices=list(self.variants))} if self.variants else {}
        return {**self.search, **arms, "seed": ParamSpace(choices=list(self.seeds))}

    def grid(self) -> dict[str, list[CategoricalChoiceType]]:
        """The grid for Optuna's GridSampler."""
        return {k: list(v.choices or ()) for k, v in self.space.items()}

    def total_trials(self) -> int:
        """Trials in the whole study: the grid size, or ``n_trials``."""
        if self.n_trials is not None:
            return self.n_trials
        size = 1
        for values in self.grid().values():
            size *= len(values)
        return size


RENAMED = {
    "objective": "optimize (the metric and direction Optuna optimizes; base.objective is the pre-training objective)",
    "finetune": "tasks (the fine-tuning tasks of each trial; base.finetune is one run's fine-tuning section)",
}
"""Study keys renamed, and what their new names say (a study that still names them is refused)."""


def load_study(path: str | Path) -> tuple[StudySpec, StudyBase]:
    """Read and validate a study YAML; return the spec and its base (read once: inline, or the file it names)."""
    path = Path(path)
    raw: dict[str, Any] = read_yaml(path)  # validated by StudySpec
    for old, new in RENAMED.items():
        if old in raw:
            raise ConfigError(f"{path}: {old}: renamed {new}")
    if isinstance(raw.get("teacher"), dict) and "into" in raw["teacher"]:
        raise ConfigError(f"{path}: teacher.into: gone; declare the model every trial prunes as prune_source: instead")
    try:
        spec = StudySpec(**raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {format_error(exc, known=spec_keys(StudySpec))}") from None
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    base = _base(spec, path)
    validate_study(spec, base, path)
    return spec, base


def _base(spec: StudySpec, path: Path) -> StudyBase:
    """The study's base: inline, or the config file it names, its keys checked (an error names the key)."""
    if isinstance(spec.base, str):
        tree, where = read_yaml(path.parent / spec.base), f"{path.parent / spec.base}: "
    else:
        tree, where = spec.base, f"{path}: base."
    try:
        return StudyBase(tree)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None


def validate_study(spec: StudySpec, base: StudyBase, where: Path | str) -> None:
    """Fail before anything runs: unknown fields, grids without choices, impossible configs."""
    known = field_names()
    sections = {
        "overrides": spec.overrides,
        "search": spec.search,
        **{f"variants.{name}": changes for name, changes in spec.variants.items()},
    }
    owner = spec.study_model.SECTION if spec.study_model is not None else ""
    for section, keys in sections.items():
        for key in keys:
            if key not in known:
                raise ConfigError(f"{where}: {section}.{key}: not a config field{did_you_mean(key, known)}")
            if key in spec.set_by_study:
                raise ConfigError(f"{where}: {section}.{key}: set by the study's {owner} section")
            if spec.tasks and key.startswith("finetune."):
                raise ConfigError(f"{where}: {section}.{key}: a chained study's fine-tuning is its tasks:")
    if spec.sampler == "grid":
        for key, space in spec.search.items():
            if space.choices is None:
                raise ConfigError(f"{where}: search.{key}: the grid sampler needs a list of choices")
    elif spec.n_trials is None:
        raise ConfigError(f"{where}: n_trials: required for the {spec.sampler} sampler")
    try:
        trials = corner_trials(spec, base)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    check_search_reaches(spec, trials, where)
    students = [cfg for _, cfg in trials]
    if spec.study_model is not None and spec.study_model.model is not None:
        _validate_study_model(spec.study_model, spec, base, students, where)
    if spec.tasks and isinstance(base.get("finetune"), dict):
        raise ConfigError(f"{where}: base.finetune: a chained study's fine-tuning is its tasks:")
    check_tasks(students[0], spec.tasks, where, has_study_model=spec.study_model is not None)
    check_task_variants(spec.tasks, list(spec.variants), where)


def _validate_study_model(
    study_model: StudyModel, spec: StudySpec, base: StudyBase, students: list[ExperimentConfig], where: Path | str
) -> None:
    """The study model's overrides name config fields, its config is valid and it shares the trials' tokenizer."""
    known, section = field_names(), study_model.SECTION
    for key in study_model.overrides:
        if key not in known:
            raise ConfigError(f"{where}: {section}.overrides.{key}: not a config field{did_you_mean(key, known)}")
        if key in ("regime", *REGIME_SOURCE.values()):
            raise ConfigError(f"{where}: {section}.overrides.{key}: the study's {section} is pre-trained from scratch")
    try:
        model_cfg = study_model_config(base, spec)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {section}.{exc}") from None
    model = flatten(model_cfg)
    for cfg in students:
        student = flatten(cfg)
        # a distilled student with a smaller vocabulary trains its own tokenizer on the same corpus and
        # learns through it (Zhao et al.'s dual training); every other trial shares the model's tokenizer
        own = cfg.regime == "distill" and cfg.model.vocab_size < model_cfg.model.vocab_size
        for key in TOKENIZER_FIELDS:
            if key == "model.vocab_size" and own:
                continue
            if model[key] != student[key]:
                raise ConfigError(
                    f"{where}: {section}.{key}: {model[key]!r} differs from the trials' "
                    f"{student[key]!r}; they must share one tokenizer"
                )


def corner_configs(spec: StudySpec, base: StudyBase) -> list[ExperimentConfig]:
    """The configs at the corners of the search space (every grid point for a grid).

    With a study model they name a placeholder as its source, so that the ``distill`` (``prune``,
    ``quant``) section is validated (stages against ``trainer.max_steps`` ...) before it exists.
    """
    return [cfg for _, cfg in corner_trials(spec, base)]


def corner_trials(spec: StudySpec, base: StudyBase) -> list[tuple[Params, ExperimentConfig]]:
    """:func:`corner_configs` with each one's params (``variant`` included, the first seed). A point
    whose config is invalid raises a ConfigError naming its searched values (``search.model.num_heads=3:``)."""
    space = {k: v for k, v in spec.space.items() if k != "seed"}
    values = {k: v.corners() for k, v in space.items()}
    study_model = PLACEHOLDER_SOURCE if spec.study_model is not None else None
    seed = {"seed": spec.seeds[0]}
    trials = []
    for point in points(values, full=all(v.choices is not None for v in space.values())):
        try:
            trials.append((point | seed, trial_config(base, spec, point | seed, study_model)))
        except ConfigError as exc:
            if str(exc).startswith("variants."):  # a variant's error names the variant
                raise
            keys = _searched_culprits(base, spec, point | seed, values, study_model)
            searched = ", ".join(f"search.{k}={point[k]}" for k in keys)
            raise ConfigError(f"{searched}: {exc}" if searched else str(exc)) from None
    return trials


def _searched_culprits(
    base: StudyBase, spec: StudySpec, params: Params, values: Mapping[str, Sequence[Json]], study_model: str | None
) -> list[str]:
    """The searched keys whose values make the invalid trial ``params`` invalid (:func:`culprits`)."""

    def valid(changed: Params) -> bool:
        try:
            trial_config(base, spec, changed, study_model)
        except ConfigError:
            return False
        return True

    return [k for k in culprits(params, values, valid) if k in spec.search] or list(spec.search)


def trial_config(base: StudyBase, spec: StudySpec, params: Params, study_model: str | None = None) -> ExperimentConfig:
    """The config of one trial: base, the study's fixed overrides, the variant's, then the sampled params.

    Args:
        base: the study's base config tree.
        spec: the study.
        params: the sampled parameters (dotted names, ``variant`` and ``seed``).
        study_model: the study's model (``runs:/RUN_ID`` or a folder), set as the field it fills
            (``distill.teacher``, ``prune.source``; a reference: the trial's regime's source);
            None keeps whatever the base says.
    """
    params = dict(params)
    name = params.pop("variant", None)
    variant = spec.variants.get(name, {}) if isinstance(name, str) else {}  # a variant is named by its key
    try:
        field: str | None = spec.study_model.FIELD if spec.study_model is not None else "distill.teacher"
        if spec.reference is not None:
            field = _reference_field(base, {**spec.overrides, **variant, **params})
        source = {field: study_model} if study_model is not None and field is not None else {}
        return base.apply({**spec.overrides, **variant, **params, "name": spec.name, **source})
    except ConfigError as exc:
        raise ConfigError(f"variants.{name}: {exc}" if variant else str(exc)) from None


def _reference_field(base: StudyBase, changes: Mapping[str, object]) -> str | None:
    """The source field a trial's regime fills with the study's reference (None: a ``pretrain`` trial,
    trained from scratch beside the compressed ones; its tasks may still learn from the reference
    fine-tuned, ``tasks[i].distill``)."""
    regime = changes.get("regime", base.get("regime"))
    if regime == "pretrain":
        return None
    if regime not in REFERENCE_FIELDS:
        raise ConfigError(
            f"regime: {regime!r}: a trial of a study with a reference names its regime, one of pretrain, "
            f"{', '.join(REFERENCE_FIELDS)} (the reference is its {', '.join(REFERENCE_FIELDS.values())})"
        )
    return REFERENCE_FIELDS[regime]


def study_model_config(base: StudyBase, spec: StudySpec) -> ExperimentConfig:
    """The config of the model a study trains (its teacher, prune_source or reference): the base
    with its ``model`` section replaced by the study model's (and no ``init_from``, ``distill``,
    ``prune``, ``quant`` or ``finetune``, which are the trials'), then its ``overrides``; named
    ``<study>-<section>`` (``<study>-teacher``, ``<study>-prune_source`` ...), a pre-training run.

    Raises:
        ValueError: the study trains no model of its own (no ``.model`` in its study model's section).
        ConfigError: its config is invalid (naming the dotted key).
    """
    study_model = spec.study_model
    if study_model is None or study_model.model is None:
        raise ValueError(f"study {spec.name} trains no model of its own (teacher, prune_source or reference)")
    tree = base.without("init_from", *REGIME_SOURCE).tree  # the trials' own left out
    tree["model"] = copy.deepcopy(study_model.model)
    overrides = {**study_model.overrides, "name": f"{spec.name}-{study_model.SECTION}", "regime": "pretrain"}
    return build_config(tree, overrides)
