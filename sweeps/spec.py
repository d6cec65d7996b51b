"""Study specs: a base experiment, a search space over config fields, seeds, objective,
sampler, pruner and the report to regenerate. Read from YAML and fully validated (every
grid point builds a valid config) before anything runs.

Example::

    name: quickstart
    base: {model: {preset: albert-tiny}, trainer: {max_steps: 200}}   # or a path to a config YAML
    search:
      model.embed_dim: {choices: [32, 128]}
      model.sharing: {choices: [all, none]}
      optim.lr: {low: 1.0e-4, high: 1.0e-2, log: true}      # float range (not for grid)
    variants:                                               # optional named arms, each a set of overrides
      tall-narrow: {model.num_layers: 8, model.hidden_dim: 96}
      short-wide: {model.num_layers: 2, model.hidden_dim: 192}
    seeds: [0, 1]
    sampler: grid
    pruner: {type: median, n_warmup_steps: 100}
    objective: {metric: val/loss, direction: minimize}
    report: {...}                                           # see reports.spec.ReportSpec
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

import optuna
from pydantic import ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from lightning_modules.config import ExperimentConfig, _format_error, build_config, field_names, read_yaml
from lightning_modules.errors import ConfigError

_STRICT = ConfigDict(extra="forbid")


@dataclass(frozen=True, config=_STRICT)
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
                raise ValueError("choices: empty search space")
            if self.low is not None or self.high is not None:
                raise ValueError("choices: give either choices or low/high, not both")
        elif self.low is None or self.high is None:
            raise ValueError("choices: give choices, or both low and high")
        elif self.low > self.high:
            raise ValueError(f"low: {self.low} is above high {self.high}")
        return self

    @property
    def is_int(self) -> bool:
        return self.type == "int" or (self.type is None and float(self.low).is_integer()
                                      and float(self.high).is_integer() and not self.log)

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        """Sample this field for ``trial`` under its dotted name."""
        if self.choices is not None:
            return trial.suggest_categorical(name, self.choices)
        if self.is_int:
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)

    def corners(self) -> list[Any]:
        """Values that together exercise the space (for validation before running)."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]


@dataclass(frozen=True, config=_STRICT)
class PrunerSpec:
    """Optuna pruner on the validation loss: ``none``, ``median``, ``hyperband`` or ``threshold``."""

    type: Literal["none", "median", "hyperband", "threshold"] = "median"
    n_startup_trials: int = Field(default=2, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)
    upper: float | None = None

    def build(self, max_steps: int) -> optuna.pruners.BasePruner:
        factories = {
            "none": lambda: optuna.pruners.NopPruner(),
            "median": lambda: optuna.pruners.MedianPruner(self.n_startup_trials, self.n_warmup_steps),
            "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=max(1, self.n_warmup_steps),
                                                                max_resource=max_steps),
            "threshold": lambda: optuna.pruners.ThresholdPruner(upper=self.upper, n_warmup_steps=self.n_warmup_steps),
        }
        return factories[self.type]()


@dataclass(frozen=True, config=_STRICT)
class ObjectiveSpec:
    """The metric a trial returns to Optuna."""

    metric: str = "val/loss"
    direction: Literal["minimize", "maximize"] = "minimize"


@dataclass(frozen=True, config=_STRICT)
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
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    report: dict[str, Any] | None = None

    @property
    def space(self) -> dict[str, ParamSpace]:
        """The search space, plus ``variant`` (the named arms, if any) and ``seed``."""
        arms = {"variant": ParamSpace(choices=list(self.variants))} if self.variants else {}
        return {**self.search, **arms, "seed": ParamSpace(choices=list(self.seeds))}

    def grid(self) -> dict[str, list[Any]]:
        """The grid for Optuna's GridSampler."""
        return {k: list(v.choices) for k, v in self.space.items()}

    def total_trials(self) -> int:
        """Trials in the whole study: the grid size, or ``n_trials``."""
        if self.n_trials is not None:
            return self.n_trials
        size = 1
        for values in self.grid().values():
            size *= len(values)
        return size


def load_study(path: str | Path) -> tuple[StudySpec, dict[str, Any]]:
    """Read and validate a study YAML; return the spec and the resolved base config tree."""
    path = Path(path)
    raw = read_yaml(path)
    try:
        spec = StudySpec(**raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_format_error(exc)}") from None
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    base = spec.base if isinstance(spec.base, dict) else read_yaml(path.parent / spec.base)
    validate_study(spec, base, path)
    return spec, base


def validate_study(spec: StudySpec, base: dict[str, Any], where: Path | str) -> None:
    """Fail before anything runs: unknown fields, grids without choices, impossible configs."""
    known = field_names()
    for key in [*spec.overrides, *spec.search]:
        if key not in known:
            raise ConfigError(f"{where}: search.{key}: not a config field")
    for name, changes in spec.variants.items():
        for key in changes:
            if key not in known:
                raise ConfigError(f"{where}: variants.{name}.{key}: not a config field")
    if spec.sampler == "grid":
        for key, space in spec.search.items():
            if space.choices is None:
                raise ConfigError(f"{where}: search.{key}: the grid sampler needs a list of choices")
    elif spec.n_trials is None:
        raise ConfigError(f"{where}: n_trials: required for the {spec.sampler} sampler")
    try:
        corner_configs(spec, base)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def corner_configs(spec: StudySpec, base: dict[str, Any]) -> list[ExperimentConfig]:
    """The configs at the corners of the search space (every grid point for a grid)."""
    space = {k: v for k, v in spec.space.items() if k != "seed"}
    keys = list(space)
    return [trial_config(base, spec, dict(zip(keys, values)) | {"seed": spec.seeds[0]})
            for values in itertools.product(*(space[k].corners() for k in keys))]


def trial_config(base: dict[str, Any], spec: StudySpec, params: dict[str, Any]) -> ExperimentConfig:
    """The config of one trial: base, the study's fixed overrides, the variant's, then the sampled params."""
    params = dict(params)
    name = params.pop("variant", None)
    variant = spec.variants.get(name, {})
    try:
        return build_config(base, {**spec.overrides, **variant, **params, "name": spec.name})
    except ConfigError as exc:
        raise ConfigError(f"variants.{name}: {exc}" if variant else str(exc)) from None
