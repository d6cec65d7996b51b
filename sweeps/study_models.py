"""The trained model a study uses, declared in its YAML: a ``teacher`` every trial distils from,
a ``prune_source`` every trial prunes, or a ``reference`` every trial compresses by its own regime.
Given (``source``) or trained once for the study (``model`` + ``overrides``)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config import REGIME_SOURCE
from ablate.lightning_modules.errors import STRICT


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
            raise ValueError(
                f"source: give exactly one of {self.SECTION}.source (an existing model: runs:/RUN_ID or a "
                f"checkpoint folder) and {self.SECTION}.model (a model to train once for the study)"
            )
        if self.source is not None and self.overrides:
            raise ValueError(f"overrides: only for a model the study trains ({self.SECTION}.model), not .source")
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
