"""The sections of a study that are more than overrides: its trained model (a ``teacher``, a
``prune_source`` or a ``reference``, given as ``source`` or trained once from ``model`` +
``overrides``) and its fine-tuning tasks (``tasks:``, each a :class:`FinetuneTask`; ``glue: mrpc``
takes the GLUE table's settings), with their checks."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, StrictInt, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT, ConfigError, FieldError
from ablate.lightning_modules.config.experiment import REGIME_SOURCE, ExperimentConfig, to_dict
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.paths import input_file

PLACEHOLDER_SOURCE = "runs:/study-model"
"""Stands in for the study's model (teacher, prune_source, reference) in trial configs validated before it exists."""
LOCAL = (".tsv", ".csv", ".json", ".jsonl", ".gz")
"""A fine-tuning task's data given as a local file (else a ``datasets`` hub name)."""


@dataclass(frozen=True, config=STRICT)
class StudyModel:
    """A trained model the whole study uses, given or trained once for the study.

    Attributes:
        source: an existing model, used as is: ``runs:/RUN_ID`` or a checkpoint folder.
        model: the ``model`` section of a model trained once for the study (``preset:``
            allowed); the rest of its config is the study's base.
        overrides: dotted overrides of this model's config only (``trainer.max_steps``,
            ``optim.lr``, ...); the study's ``overrides``, search and variants are the trials'.
    """

    FIELD: ClassVar[str] = ""
    """The trial config field it is given as."""
    SECTION: ClassVar[str] = ""
    """The study's section that declares it (also its MLflow run's name and role)."""

    source: str | None = Field(default=None, min_length=1)
    model: dict[str, Any] | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_source(self) -> StudyModel:
        if (self.source is None) == (self.model is None):
            raise FieldError(
                "source",
                f"give exactly one of {self.SECTION}.source (an existing model: runs:/RUN_ID or a "
                f"checkpoint folder) and {self.SECTION}.model (a model to train once for the study)",
            )
        if self.source is not None and self.overrides:
            raise FieldError("overrides", f"only for a model the study trains ({self.SECTION}.model), not .source")
        return self


@dataclass(frozen=True, config=STRICT)
class TeacherSpec(StudyModel):
    """The teacher every trial of a study distils from (``distill.teacher`` of each trial)."""

    FIELD: ClassVar[str] = "distill.teacher"
    SECTION: ClassVar[str] = "teacher"


@dataclass(frozen=True, config=STRICT)
class PruneSourceSpec(StudyModel):
    """The trained model every trial of a study prunes (``prune.source`` of each trial: schuBERT studies)."""

    FIELD: ClassVar[str] = "prune.source"
    SECTION: ClassVar[str] = "prune_source"


@dataclass(frozen=True, config=STRICT)
class ReferenceSpec(StudyModel):
    """The trained model a study compresses by several methods: each trial names its regime and the
    reference is that regime's source (``distill.teacher``, ``prune.source`` or ``quant.source``)."""

    FIELD: ClassVar[str] = ""  # per trial: REFERENCE_FIELDS[its regime]
    SECTION: ClassVar[str] = "reference"


REFERENCE_FIELDS = {regime: REGIME_SOURCE[regime] for regime in ("distill", "prune", "quant")}
"""The regimes a trial of a study with a ``reference`` may have, and the field the reference fills."""


@dataclass(frozen=True, config=STRICT)
class FinetuneTask(FinetuneConfig):
    """One fine-tuning task of a chained study (an entry of its ``tasks``): a whole ``finetune``
    section of a run's config (unset fields take its defaults; ``source`` is each trial's own
    pre-trained model), the seeds it is fine-tuned with, and how it learns from a fine-tuned teacher.

    Attributes:
        glue: (a run's ``finetune.glue``) the GLUE task this is: its score also counts in the trial's
            ``glue/score``.
        seeds: fine-tune once per seed (one stage run each; the trial carries each metric's mean
            and ``<task>/best_<metric>_std``); None: once, with the trial's seed.
        variants: the study's variants whose trials this task fine-tunes (None: every trial); tasks
            of the same name must not share a variant (a trial fine-tunes a task once), so the
            variants of one comparison may each be fine-tuned their own way under one metric name
            (FastBERT's exits for one arm, TinyBERT's task distillation for another).
        distill: task distillation: the ``distill`` section of this task's fine-tuning runs
            (``kd_weight``, ``label_weight``, ``temperature``, ``strategy``, ``stage_steps``, the
            intermediate terms ...). Its ``teacher`` left out: the study's trained model
            (``teacher``, ``reference`` or ``prune_source``) fine-tuned on this task, once for the
            whole study (without augmentation, exits or distillation of its own); or a fine-tuned
            classifier given as ``runs:/RUN_ID`` or a folder.

    A task that augments its training set (``augment_copies``) without naming ``augment_model``
    draws its candidates from the study's trained model's MLM head when the study has one (as
    TinyBERT augments with its teacher's BERT), else from each trial's own pre-trained model.
    """

    seeds: tuple[Annotated[StrictInt, Field(ge=0)], ...] | None = Field(default=None, min_length=1)
    variants: tuple[str, ...] | None = Field(default=None, min_length=1)
    distill: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_task(self) -> FinetuneTask:
        if self.source is not None:
            raise FieldError("source", "set by the chain (each trial's own pre-trained model)")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise FieldError("seeds", f"{list(self.seeds)}: repeated seeds")
        return self

    def runs_for(self, variant: object) -> bool:
        """Whether a trial of ``variant`` (None: a study without variants) is fine-tuned on this task."""
        return self.variants is None or variant in self.variants

    @property
    def study_teacher(self) -> bool:
        """Whether this task learns from the study's model fine-tuned on it (``distill`` without a teacher)."""
        return self.distill is not None and self.distill.get("teacher") is None

    def teacher_task(self) -> FinetuneTask:
        """The task the study's model is fine-tuned on to teach this one: the same data and
        schedule, no augmentation, exits or teacher."""
        return dataclasses.replace(
            self, distill=None, augment_copies=0, exits=False, exit_steps=0, seeds=None, variants=None
        )

    def config(
        self,
        cfg: ExperimentConfig,
        source: str,
        seed: int | None = None,
        teacher: str | None = None,
        study_model: str | None = None,
    ) -> ExperimentConfig:
        """The fine-tuning config of this task for the trial ``cfg`` pre-trained as ``source``:
        a ``finetune`` run with the trial's model, data and tracking settings, distilled from
        ``teacher`` (the study's fine-tuned model; else ``distill.teacher`` as given) when the task
        distils, augmented with ``study_model``'s MLM head (the study's trained model) unless it names its own."""
        own = ("seeds", "source", "distill", "variants")
        fields = {f"finetune.{k}": v for k, v in asdict(self).items() if k not in own}
        if self.augment_copies and self.augment_model is None and study_model is not None:
            fields["finetune.augment_model"] = study_model
        tree = {k: v for k, v in to_dict(cfg).items() if k not in REGIME_SOURCE}  # the trial's regime section
        tree["quant"] = {**to_dict(cfg.quant), "source": None}  # a quantized trial's classifier is quantized alike
        regime = {"regime": "finetune", "finetune.source": source}
        distill = {f"distill.{k}": v for k, v in (self.distill or {}).items()}
        if self.study_teacher:
            distill["distill.teacher"] = teacher
        return build_config(tree, {**fields, **({} if seed is None else {"seed": seed}), **regime, **distill})


def check_task_variants(tasks: list[FinetuneTask], variants: list[str], where: Path | str) -> None:
    """A task's ``variants`` name ``variants`` of the study, and no variant is fine-tuned twice on one task name."""
    seen: dict[tuple[str, str | None], int] = {}
    for i, task in enumerate(tasks):
        if task.variants is not None:
            unknown = [v for v in task.variants if v not in variants]
            if unknown:
                raise ConfigError(
                    f"{where}: tasks[{i}].variants: {unknown[0]!r} is not one of the study's variants "
                    f"({', '.join(variants) or 'it has none'})"
                )
        arms: list[str | None] = [*(task.variants or variants)] or [None]  # None: a study without variants
        for variant in arms:
            if (task.task, variant) in seen:
                who = f"variant {variant!r}" if variant is not None else "every trial"
                raise ConfigError(
                    f"{where}: tasks[{i}].variants: {who} is already fine-tuned on task {task.task!r} "
                    f"by tasks[{seen[task.task, variant]}]"
                )
            seen[task.task, variant] = i


def check_tasks(
    cfg: ExperimentConfig, tasks: list[FinetuneTask], where: Path | str, has_study_model: bool = True
) -> None:
    """Every fine-tuning task builds a valid config for the trial ``cfg`` and its local files exist;
    a task that distils from the study's model needs one (``has_study_model``)."""
    for i, task in enumerate(tasks):
        if task.study_teacher and not has_study_model:
            raise ConfigError(
                f"{where}: tasks[{i}].distill.teacher: the study trains no model to fine-tune as the task's "
                f"teacher (teacher:, reference: or prune_source:); name a fine-tuned classifier "
                f"(runs:/RUN_ID or a folder)"
            )
        try:
            task.config(cfg, PLACEHOLDER_SOURCE, teacher=PLACEHOLDER_SOURCE)
        except ConfigError as exc:
            raise ConfigError(f"{where}: tasks[{i}]: {exc}") from None
        for key in ("train", "validation"):
            value = getattr(task, key)
            if value is not None and value.endswith(LOCAL):
                try:
                    input_file(value, f"tasks[{i}].{key}")
                except ConfigError as exc:
                    raise ConfigError(f"{where}: {exc}") from None
