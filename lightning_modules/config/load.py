"""Configs from YAML files, presets and ``key=value`` overrides: the one YAML reader and the
one place a raw tree becomes a validated :class:`ExperimentConfig`."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ablate.lightning_modules.config.errors import ConfigError, did_you_mean, format_error
from ablate.lightning_modules.config.experiment import ExperimentConfig, field_names, to_dict
from ablate.lightning_modules.config.paths import kind_problem
from ablate.lightning_modules.config.presets import preset_fields
from ablate.lightning_modules.config.yamlio import AliasBombError, Json, load_yaml


def set_dotted(tree: dict[str, Any], key: str, value: object) -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Json]:
    """Parse ``key=value``; the value is read as YAML (``64``, ``true``, ``null``, ``all``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
        raise ConfigError(f"override {text!r}: expected key=value, e.g. model.embed_dim=64")
    try:
        value: Json = load_yaml(raw) if raw.strip() else ""
    except (yaml.constructor.ConstructorError, AliasBombError) as exc:  # a duplicate key in a flow mapping
        raise ConfigError(f"override {text!r}: {exc.problem}") from None
    except yaml.YAMLError:
        value = raw
    return key, value


def parse_overrides(texts: Iterable[str]) -> dict[str, Json]:
    """``key=value`` overrides (:func:`parse_override`) by key; a key given twice is refused (the
    command line would otherwise keep its last value silently)."""
    out: dict[str, Json] = {}
    for text in texts:
        key, value = parse_override(text)
        if key in out:
            raise ConfigError(f"override {key}: given twice ({out[key]!r}, then {value!r}); give it once")
        out[key] = value
    return out


def read_yaml(path: str | Path, what: str = "a mapping of config sections") -> dict[str, Json]:
    """Read a YAML mapping (config, study or report spec), raising ConfigError naming the file on any problem."""
    path = Path(path)
    problem = kind_problem(path, "file")
    if problem is not None:
        raise ConfigError(f"{path}: {problem}")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply to be a config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        if "'\\t'" in problem:
            problem += " (indent with spaces, not tabs)"
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: empty file; expected {what}")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected {what}")
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{path}: nested more than {MAX_DEPTH} levels deep; expected {what}")
    return data


MAX_DEPTH = 12
"""The deepest nesting a config, study or report spec has any use for."""


def _depth(value: object, limit: int = MAX_DEPTH + 1) -> int:
    """How deeply ``value`` nests lists and mappings (counted up to ``limit``)."""
    if limit <= 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def build_config(raw: Mapping[str, object], overrides: Mapping[str, object] | None = None) -> ExperimentConfig:
    """Validate a raw config tree (plus dotted overrides) into an ExperimentConfig.

    ``model.preset`` names a preset from :mod:`ablate.lightning_modules.config.presets`; the other
    ``model`` keys override it.
    """
    tree: dict[str, Any] = copy.deepcopy(dict(raw))  # validated below, into ExperimentConfig's fields
    for key, value in (overrides or {}).items():
        set_dotted(tree, key, value)
    not_names = ["null" if k is None else str(k) for k in tree if not isinstance(k, str)]
    if not_names:
        raise ConfigError(f"{not_names[0]}: unknown key (a config's keys are section names: model, data, trainer, ...)")
    model = tree.get("model")
    if isinstance(model, str):  # model: albert-tiny
        raise ConfigError(f"model: a mapping of model fields, not {model!r} (a preset: model: {{preset: {model}}})")
    if isinstance(model, dict) and "preset" in model:
        model = dict(model)
        base = preset_fields(model.pop("preset"))
        tree["model"] = {**base, **model}
    try:
        return ExperimentConfig(**tree)
    except ValidationError as exc:
        raise ConfigError(_blamed(format_error(exc, known=config_keys()), raw, overrides or {})) from None
    except TypeError as exc:  # positional/unknown top-level arguments
        match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if match is None:
            raise ConfigError(str(exc)) from None
        raise ConfigError(f"{match.group(1)}: unknown key{did_you_mean(match.group(1), config_keys())}") from None


PARTNERS: dict[str, tuple[str, ...]] = {
    "model.num_heads": ("model.hidden_dim", "model.intra_dim"),
    "quant.high_bits": ("quant.low_bits",),
}
"""A rule between fields, by the key its error names: the fields on the other side of it. An error is
said of the field the config set (an override before the file, the file before a preset or default):
``model.hidden_dim=100`` on a preset of 2 heads is ``model.hidden_dim: hidden_dim 100 is not divisible
by num_heads 2``, not the preset's valid ``num_heads``."""


def _blamed(message: str, raw: Mapping[str, object], overrides: Mapping[str, object]) -> str:
    """``message`` (``KEY: rule``) said of the key the config set, where :data:`PARTNERS` has a choice."""
    key, sep, rest = message.partition(": ")
    if not sep or key not in PARTNERS or ";" in rest:
        return message
    for given in (set(overrides), _dotted_keys(raw)):
        if key in given:
            return message
        partner = next((k for k in PARTNERS[key] if k in given), None)
        if partner is not None:
            return f"{partner}: {rest}"
    return message


def _dotted_keys(tree: Mapping[str, object], prefix: str = "") -> set[str]:
    keys = set()
    for k, v in tree.items():
        keys |= _dotted_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return keys


def config_keys() -> set[str]:
    """Every key a config may set: each dotted field, each section (``model``) and ``model.preset``."""
    fields = field_names()
    return fields | {key.rpartition(".")[0] for key in fields} - {""} | {"model.preset"}


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load a config YAML (or defaults when None) with ``key=value`` overrides."""
    raw = read_yaml(path) if path is not None else {}
    return build_config(raw, parse_overrides(overrides or []))


def replace(cfg: ExperimentConfig, updates: Mapping[str, object]) -> ExperimentConfig:
    """A copy of ``cfg`` with dotted-key updates applied and validated."""
    return build_config(to_dict(cfg), updates)
