"""``ablate sweep STUDY key=value ...``: a study run with changes to its base config, without editing
its file (a quick run of a shipped study: ``trainer.max_steps=50``), as ``ablate train CONFIG key=value``
changes a config.

An override sets the field in the study's base config: in every trial, and in the base that the study's
own model (teacher, prune_source, reference) is built from, where its own ``overrides:`` still win. It
replaces the study's fixed ``overrides:`` of the same key. Refused, with one line and nothing written:
a key that is not a config field (with the closest one), a field the study's search sets in each trial
(:func:`~ablate.sweeps.reach.check_not_searched`: the override would be dropped), a field the sweep itself
sets (the study model's source, the experiment and run names) and a chained study's ``finetune.*`` (its
``tasks:`` are its fine-tuning).

An overridden study is a study of its own, so that its trials are never mixed with the unchanged
study's in one Optuna store or MLflow experiment: it is named ``NAME-<8 hex digits>``, a digest of its
overrides (the same overrides give the same name, so the same command resumes it), or ``name=NEW``. Its
parent run carries the overrides as the tag :data:`TAG`; every trial's params show the values.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shlex
from typing import Any

from ablate.lightning_modules.config.errors import ConfigError, did_you_mean
from ablate.lightning_modules.config.load import config_keys, parse_override, set_dotted
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
        base: Its base config tree, with the overrides set.
        given: The overrides as given on the command line.
        original: The name in the study's file.
    """

    spec: StudySpec
    base: dict[str, Any]
    given: tuple[str, ...]
    original: str

    @property
    def shown(self) -> str:
        """The overrides as one would type them again: ``trainer.max_steps=20 'optim.lr=1e-3'``."""
        return " ".join(shlex.quote(text) for text in self.given)


def study_name(name: str, changes: dict[str, Any]) -> str:
    """``NAME-<8 hex digits>``: the name of study ``name`` with ``changes`` (the same changes, the same name)."""
    digest = hashlib.sha256(json.dumps(changes, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{name}-{digest}"


def override_study(spec: StudySpec, base: dict[str, Any], texts: list[str]) -> Overridden:
    """Apply ``key=value`` overrides to a validated study (raising ConfigError naming the key, before
    anything exists). The caller validates the result again (:func:`~ablate.sweeps.spec.validate_study`).
    """
    changes = dict(parse_override(text) for text in texts)
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
    tree = copy.deepcopy(base)
    for key, value in changes.items():
        set_dotted(tree, key, value)
    fixed = {**spec.overrides, **{key: value for key, value in changes.items() if key in spec.overrides}}
    renamed = name or study_name(spec.name, changes)
    try:
        new = dataclasses.replace(spec, name=renamed, overrides=fixed)
    except ValueError as exc:  # pydantic's ValidationError: the name
        raise ConfigError(f"name: {renamed!r}: not a study name (letters, digits, ., _ and -)") from exc
    return Overridden(new, tree, tuple(texts), spec.name)
