"""``ablate sweep STUDY key=value ...``: a study run with changes to its base config, without editing
its file; refused where a key is not a config field, is searched, is set by the sweep, or is a
chained study's ``finetune.*``. The changed study is a study of its own, ``NAME-<8 hex digits>``, its
overrides on its parent run as :data:`TAG` (docs/studies.md, "Overrides on the command line")."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from collections.abc import Mapping

from ablate.lightning_modules.config.errors import ConfigError, did_you_mean
from ablate.lightning_modules.config.load import config_keys, parse_overrides
from ablate.sweeps.base import StudyBase
from ablate.sweeps.reach import check_not_searched
from ablate.sweeps.spec import StudySpec

TAG = "ablate.overrides"
"""The tag of an overridden study's parent run: its overrides as given (``trainer.max_steps=20``)."""

SET_BY_SWEEP = {
    "tracking.experiment": "a study's runs go to the experiment of the study's name (name=NEW renames the study)",
    "tracking.run_name": "each trial's run is named by what it samples",
}
"""Config fields a sweep sets for every trial itself, and how."""


@dataclasses.dataclass(frozen=True)
class Overridden:
    """A study with command-line overrides applied.

    Attributes:
        spec: The study, renamed (and its fixed ``overrides:`` updated).
        base: Its base, with the overrides set.
        given: The overrides as given on the command line.
        original: The name in the study's file.
    """

    spec: StudySpec
    base: StudyBase
    given: tuple[str, ...]
    original: str

    @property
    def shown(self) -> str:
        """The overrides as one would type them again: ``trainer.max_steps=20 'optim.lr=1e-3'``."""
        return " ".join(shlex.quote(text) for text in self.given)


def study_name(name: str, changes: Mapping[str, object]) -> str:
    """``NAME-<8 hex digits>``: the name of study ``name`` with ``changes`` (the same changes, the same name)."""
    digest = hashlib.sha256(json.dumps(changes, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def override_study(spec: StudySpec, base: StudyBase, texts: list[str]) -> Overridden:
    """Apply ``key=value`` overrides to a validated study (raising ConfigError naming the key, before
    anything exists). The caller validates the result again (:func:`~ablate.sweeps.spec.validate_study`).
    """
    changes = parse_overrides(texts)
    name = changes.pop("name", None)
    known = config_keys()
    for key in changes:
        if key not in known:
            raise ConfigError(f"{key}: unknown key{did_you_mean(key, known)}")
        if key in SET_BY_SWEEP:
            raise ConfigError(f"{key}: set by the sweep ({SET_BY_SWEEP[key]})")
        if key in spec.set_by_study:
            owner = spec.study_model.SECTION if spec.study_model is not None else "study"
            raise ConfigError(f"{key}: set by the study's {owner} section")
        if spec.tasks and key.split(".")[0] == "finetune":
            raise ConfigError(f"{key}: a chained study's fine-tuning is its tasks: (a task's own settings)")
    check_not_searched(spec, changes)
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"name: {name!r}: a study name is text (letters, digits, ., _ and -)")
    fixed = {**spec.overrides, **{key: value for key, value in changes.items() if key in spec.overrides}}
    renamed = name or study_name(spec.name, changes)
    try:
        new = dataclasses.replace(spec, name=renamed, overrides=fixed)
    except ValueError as exc:  # pydantic's ValidationError: the name
        raise ConfigError(f"name: {renamed!r}: not a study name (letters, digits, ., _ and -)") from exc
    return Overridden(new, base.changed(changes), tuple(texts), spec.name)
