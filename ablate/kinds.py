"""What a YAML file given to a command is: a run config (``ablate train``), a study (``ablate sweep``) or
a report spec (``ablate report``), told apart by the top-level keys only one kind has, so that a file of
the wrong kind is named as such (``STUDY.yaml is a study (it has search:, base:); run it with ablate
sweep STUDY.yaml``) instead of as a list of unknown keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ablate.lightning_modules.config.errors import ConfigError, spec_keys
from ablate.lightning_modules.config.load import config_keys, read_yaml
from ablate.reports.spec import ReportSpec
from ablate.sweeps.spec import StudySpec

Kind = Literal["config", "study", "report"]

WHAT: dict[Kind, str] = {"config": "a run config", "study": "a study", "report": "a report spec"}
"""Each kind, as a message names it."""

USE: dict[Kind, str] = {
    "config": "train it with ablate train {path} (or name it as a study's base: {path})",
    "study": "run it with ablate sweep {path} (its report: ablate report {path})",
    "report": "build it with ablate report {path}",
}
"""The command that takes each kind."""


def _own_keys() -> dict[Kind, set[str]]:
    """The top-level keys only one kind has (``name`` and ``reference``, which two share, are left out)."""
    tops: dict[Kind, set[str]] = {
        "config": {key for key in config_keys() if "." not in key},
        "study": {key for key in spec_keys(StudySpec) if "." not in key},
        "report": {key for key in spec_keys(ReportSpec) if "." not in key},
    }
    return {kind: keys - set().union(*(other for o, other in tops.items() if o != kind)) for kind, keys in tops.items()}


def kind_of(raw: dict[Any, Any], wanted: Kind) -> tuple[Kind, list[str]]:
    """The kind of a file's top-level mapping ``raw`` and the keys that tell: ``wanted`` unless another
    kind has more keys of its own in it (a file of the wanted kind with a mistyped key stays that kind)."""
    sections_first = sorted(raw, key=lambda key: not isinstance(raw[key], (dict, list)))  # model: before seed:
    found = {kind: [k for k in sections_first if isinstance(k, str) and k in own] for kind, own in _own_keys().items()}
    best = max(found, key=lambda kind: len(found[kind]))
    return (best, found[best]) if len(found[best]) > len(found[wanted]) else (wanted, found[wanted])


def check_kind(path: str | Path, wanted: Kind, also: tuple[Kind, ...] = (), hint: str = "") -> None:
    """Refuse a file of another kind than ``wanted`` (or ``also``): ConfigError naming the file, what it
    is, the keys that say so and the command that takes it (then ``hint``). A file that cannot be read
    is left to the command, which names the problem."""
    try:
        raw = read_yaml(path)
    except ConfigError:
        return
    kind, keys = kind_of(raw, wanted)
    if kind != wanted and kind not in also:
        has = ", ".join(f"{key}:" for key in keys[:3])
        wanted_text = " or ".join(WHAT[k] for k in (wanted, *also))
        raise ConfigError(
            f"{path} is {WHAT[kind]} (it has {has}), not {wanted_text}; {USE[kind].format(path=path)}{hint}"
        )
