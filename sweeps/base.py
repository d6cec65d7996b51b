"""A study's base config (``base:`` inline, or the config file it names), read once and checked at load
(:func:`~ablate.sweeps.spec.load_study`): the template every trial's config is made from."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

from ablate.lightning_modules.config.errors import ConfigError, did_you_mean
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.load import build_config, config_keys, set_dotted
from ablate.lightning_modules.config.yamlio import Json


@dataclass(frozen=True)
class StudyBase:
    """A study's base config tree, its keys checked (each a config section or field; a ConfigError
    names the first that is not). The tree is copied in and out: nothing changes it once made.

    Attributes:
        raw: The tree as given (read it through :attr:`tree`, a copy; :mod:`~ablate.sweeps.definition`
            hashes it).
    """

    raw: Mapping[str, Json] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tree = copy.deepcopy(dict(self.raw))
        _check_keys(tree)
        object.__setattr__(self, "raw", tree)

    @property
    def tree(self) -> dict[str, Json]:
        """The base config tree (a copy)."""
        return copy.deepcopy(dict(self.raw))

    def get(self, key: str) -> Json:
        """The value of top-level key ``key`` (``regime``, ``name`` ...) or section, as given; None where unset."""
        return copy.deepcopy(self.raw.get(key))

    def section(self, name: str) -> dict[str, Json]:
        """Section ``name`` as given (a copy; empty where the base leaves it out)."""
        value = self.raw.get(name)
        return copy.deepcopy(value) if isinstance(value, dict) else {}

    def apply(self, changes: Mapping[str, Json] | None = None) -> ExperimentConfig:
        """The config of this base with dotted-key ``changes`` set (a trial's overrides and params),
        validated: an invalid one raises ConfigError naming the key."""
        return build_config(self.raw, changes or {})

    def changed(self, changes: Mapping[str, Json]) -> StudyBase:
        """This base with dotted-key ``changes`` set in its tree (``trainer.accelerator``, ``tracking.root``)."""
        tree = self.tree
        for key, value in changes.items():
            set_dotted(tree, key, value)
        return StudyBase(tree)

    def without(self, *keys: str) -> StudyBase:
        """This base without top-level keys or sections ``keys``."""
        return StudyBase({k: v for k, v in self.raw.items() if k not in keys})


def _check_keys(tree: Mapping[str, Json]) -> None:
    """Every key of ``tree`` a config section or top-level field, every key of a section one of its fields."""
    known = config_keys()
    for name, value in tree.items():
        if not isinstance(name, str):
            raise ConfigError(f"{name}: unknown key (a config's keys are section names: model, data, trainer, ...)")
        if name not in known:
            raise ConfigError(f"{name}: unknown key{did_you_mean(name, known)}")
        if isinstance(value, dict) and any(k.startswith(f"{name}.") for k in known):
            for key in value:
                dotted = f"{name}.{key}"
                if dotted not in known:
                    raise ConfigError(f"{dotted}: unknown key{did_you_mean(dotted, known)}")
