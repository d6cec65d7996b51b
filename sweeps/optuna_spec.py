"""A study's Optuna sections: a searched config field (:class:`ParamSpace`, sampled under its dotted
name), the pruner on the validation curve and the metric a trial returns (``optimize``), each
validated on its own; the whole study is :class:`~ablate.sweeps.spec.StudySpec`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import optuna
from optuna.distributions import CategoricalChoiceType
from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT, FieldError
from ablate.lightning_modules.config.yamlio import Json
from ablate.sweeps.guard import GuardSpec
from ablate.sweeps.space import range_values


@dataclass(frozen=True, config=STRICT)
class ParamSpace:
    """One searched field: a list of ``choices``, or a numeric range ``low``..``high``."""

    choices: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    type: Literal["int", "float"] | None = None

    @model_validator(mode="after")
    def _check(self) -> ParamSpace:
        if self.choices is not None:
            if not self.choices:
                raise FieldError("choices", "empty search space")
            if self.low is not None or self.high is not None:
                raise FieldError("choices", "give either choices or low/high, not both")
        elif self.low is None or self.high is None:
            raise FieldError("choices", "give choices, or both low and high")
        elif self.low > self.high:
            raise FieldError("low", f"{self.low} is above high {self.high}")
        return self

    @property
    def is_int(self) -> bool:
        if self.low is None or self.high is None:  # choices
            return self.type == "int"
        return self.type == "int" or (
            self.type is None and float(self.low).is_integer() and float(self.high).is_integer() and not self.log
        )

    def suggest(self, trial: optuna.Trial, name: str) -> CategoricalChoiceType:
        """Sample this field for ``trial`` under its dotted name."""
        if self.choices is not None:
            chosen: CategoricalChoiceType = trial.suggest_categorical(name, self.choices)
            return chosen
        assert self.low is not None and self.high is not None  # checked: choices, or both low and high
        if self.is_int:
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)

    def corners(self) -> Sequence[Json]:
        """The values checked before running: every value it can sample, or for a longer or continuous
        range its ends and chosen values between (:mod:`~ablate.sweeps.space`), ends first."""
        if self.choices is not None:
            return list(self.choices)
        assert self.low is not None and self.high is not None  # checked: choices, or both low and high
        return range_values(self.low, self.high, step=self.step, log=self.log, is_int=self.is_int)


@dataclass(frozen=True, config=STRICT)
class PrunerSpec:
    """Optuna pruner on the validation curve: ``none``, ``median``, ``percentile`` (prune a
    trial worse than ``percentile`` % of the others at the same step; 50 = median),
    ``hyperband`` or ``threshold`` (above ``upper``)."""

    type: Literal["none", "median", "percentile", "hyperband", "threshold"] = "median"
    n_startup_trials: int = Field(default=2, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)
    percentile: float = Field(default=50.0, gt=0.0, lt=100.0)
    upper: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> PrunerSpec:
        if self.type == "threshold" and self.upper is None:
            raise FieldError("upper", "the threshold pruner stops a trial whose metric is above upper; give it")
        return self

    def build(self, max_steps: int) -> optuna.pruners.BasePruner:
        factories: dict[str, Callable[[], optuna.pruners.BasePruner]] = {
            "none": lambda: optuna.pruners.NopPruner(),
            "median": lambda: optuna.pruners.MedianPruner(self.n_startup_trials, self.n_warmup_steps),
            "percentile": lambda: optuna.pruners.PercentilePruner(
                self.percentile, self.n_startup_trials, self.n_warmup_steps
            ),
            "hyperband": lambda: optuna.pruners.HyperbandPruner(
                min_resource=max(1, self.n_warmup_steps), max_resource=max_steps
            ),
            "threshold": lambda: optuna.pruners.ThresholdPruner(upper=self.upper, n_warmup_steps=self.n_warmup_steps),
        }
        return factories[self.type]()


@dataclass(frozen=True, config=STRICT)
class OptimizeSpec:
    """The metric a trial returns to Optuna, and the direction Optuna optimizes it in (the study's
    ``optimize``; ``base.objective`` is the pre-training objective)."""

    metric: str = "val/loss"
    direction: Literal["minimize", "maximize"] = "minimize"
    guard: GuardSpec | None = None  # an accuracy bound: the best configuration within it (sweeps/guard.py)
