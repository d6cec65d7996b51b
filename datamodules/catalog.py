"""The data catalog: ``datasets`` hub names mapped to local copies, for machines without the hub.

``ABLATE_DATA_CATALOG=/path/catalog.yaml`` names a YAML file of datasets, each a hub name as a
config writes it, with its splits as local files::

    datasets:
      wikimedia/wikipedia:20231101.en:
        train: wiki-en/train-*.jsonl.gz        # a file, a glob, a folder, or a list of them
      nyu-mll/glue:sst2:
        train: sst2/train.tsv
        validation: sst2/validation.tsv

Relative paths are resolved against the catalog file's folder (``~`` is expanded). A name is
matched by what it names, the hub path and config, however it is spelled (``nyu-mll/glue:sst2``,
``nyu-mll/glue/sst2``). A name in the catalog is read from its files (``data.corpus`` its ``train``
split, a fine-tuning task its ``train`` and ``validation`` splits, or the ones it names); any other
name is a hub name, loaded by ``datasets``. A catalog that is set but missing, unreadable or
malformed is an error of every command that resolves data.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from ablate.lightning_modules.config.errors import STRICT, ConfigError, DataError, format_error
from ablate.lightning_modules.config.load import read_yaml

ENV = "ABLATE_DATA_CATALOG"
"""The environment variable naming the catalog file."""

SPLIT = re.compile(r"^[\w.-]+$")
"""A split name (``train``, ``validation``, ``test``)."""
_CONFIG = re.compile(r"^[\w.+-]+$")
_LOCAL_SUFFIXES = (".txt", ".json", ".jsonl", ".parquet", ".gz", ".tsv", ".csv", ".tar", ".zip")

HubName = tuple[str, str | None]
"""A hub dataset: its path (``owner/name`` or ``name``) and config (None: the dataset's default)."""


def parse_hub_name(name: str) -> HubName:
    """``path``, ``path/config``, ``owner/path/config``, ``path:config`` or ``owner/path:`` (no config)
    as (path, config)."""
    path, sep, config = name.partition(":")
    if not sep:
        parts = name.split("/")
        if len(parts) in (2, 3):
            path, config = "/".join(parts[:-1]), parts[-1]
    return path, config or None


def looks_local(name: str) -> bool:
    """Whether ``name`` is written as a path (absolute, ``./``, ``~``, a glob, a data file's extension)."""
    return (
        name.startswith(("/", ".", "~"))
        or any(c in name for c in "*?[")
        or Path(name).suffix.lower() in _LOCAL_SUFFIXES
    )


def hub_form_problem(name: str) -> str | None:
    """What makes ``name`` no valid hub dataset name (checked offline), or None."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # a lazy, unmarked re-export

    path, config = parse_hub_name(name)
    try:
        validate_repo_id(path)
    except HFValidationError as exc:
        return f"not a hub dataset name ({path!r}: {str(exc).split(': ')[0]})"
    if config is not None and not _CONFIG.match(config):
        return f"not a hub config name: {config!r}"
    return None


def _problem(file: Path, message: str) -> ConfigError:
    return ConfigError(f"{ENV}: {file}: {message}")


def _paths(value: object) -> list[str]:
    """A split's files: one path or glob, or a list of them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(f"{value!r}: give a file, glob or folder, or a list of them")


@pydantic_dataclass(frozen=True, config=STRICT)
class _CatalogFile:
    """The catalog file as written: ``datasets``, hub name -> split -> path(s)."""

    datasets: dict[str, dict[str, Annotated[list[str], BeforeValidator(_paths)]]]


@dataclass(frozen=True)
class Catalog:
    """A loaded catalog.

    Attributes:
        file: the catalog file (absolute).
        names: each dataset's name as the catalog writes it, by what it names.
        entries: each dataset's splits, as absolute paths or globs, by what it names.
    """

    file: Path
    names: Mapping[HubName, str]
    entries: Mapping[HubName, Mapping[str, tuple[str, ...]]]

    def has(self, name: str) -> bool:
        """Whether the hub name ``name`` is in the catalog."""
        return parse_hub_name(name) in self.entries

    def patterns(self, name: str, split: str, key: str) -> tuple[str, ...] | None:
        """The local paths or globs of ``name``'s ``split``; None when ``name`` is not in the catalog.

        Raises:
            DataError: ``name`` is in the catalog without that split (``key`` names the setting).
        """
        splits = self.entries.get(parse_hub_name(name))
        if splits is None:
            return None
        if split not in splits:
            raise DataError(
                f"{key}: {name}: {ENV}: {self.file}: {self.names[parse_hub_name(name)]} has no {split!r} split "
                f"(it has {', '.join(splits)})"
            )
        return splits[split]


def _absolute(file: Path, pattern: str) -> str:
    path = Path(os.path.expanduser(pattern))
    return str(path if path.is_absolute() else file.parent / path)


def load_catalog(file: str | Path) -> Catalog:
    """Read and check a catalog file.

    Raises:
        ConfigError: ``ABLATE_DATA_CATALOG: FILE: ...``: missing, unreadable, not YAML, or not a
            catalog (unknown keys, a name that is a path or no hub name, a split without files).
    """
    file = Path(file).expanduser().absolute()
    if file.is_dir():
        raise _problem(file, "is a folder, not a catalog file")
    if file.exists() and not os.access(file, os.R_OK):
        raise _problem(file, "cannot be read")
    try:
        raw = read_yaml(file, what="a catalog: datasets: {HUB_NAME: {SPLIT: FILES}}")
        parsed = _CatalogFile(**raw)
    except ConfigError as exc:
        raise ConfigError(f"{ENV}: {exc}") from None
    except ValidationError as exc:
        raise _problem(file, format_error(exc)) from None
    except TypeError as exc:
        raise _problem(file, str(exc)) from None
    names: dict[HubName, str] = {}
    entries: dict[HubName, dict[str, tuple[str, ...]]] = {}
    for name, splits in parsed.datasets.items():
        where = f"datasets.{name}"
        problem = "a local path, not a hub name" if looks_local(name) else hub_form_problem(name)
        if problem:
            raise _problem(file, f"{where}: {problem}")
        hub = parse_hub_name(name)
        if hub in names:
            raise _problem(file, f"{where}: the same dataset as {names[hub]}")
        if not splits:
            raise _problem(file, f"{where}: no split; give its splits' files (train: FILES, ...)")
        entries[hub] = {}
        for split, given in splits.items():
            if not SPLIT.match(split):
                raise _problem(file, f"{where}.{split}: not a split name (letters, digits, _ . -)")
            if not given or any(not p.strip() for p in given):
                raise _problem(file, f"{where}.{split}: empty; give a file, glob or folder")
            entries[hub][split] = tuple(_absolute(file, p) for p in given)
        names[hub] = name
    return Catalog(file, names, entries)


_loaded: dict[tuple[str, int, int], Catalog] = {}


def active_catalog() -> Catalog | None:
    """The catalog ``ABLATE_DATA_CATALOG`` names (read once per version of the file), or None when unset.

    Raises:
        ConfigError: the variable names a missing, unreadable or malformed catalog.
    """
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    file = Path(value).expanduser().absolute()
    try:
        stat = file.stat()
    except OSError:
        raise _problem(file, "no such file") from None
    key = (str(file), stat.st_mtime_ns, stat.st_size)
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = load_catalog(file)
    return _loaded[key]


def hub_hint(name: str) -> str:
    """For an error about loading hub name ``name``: that the active catalog does not map it, or
    that a catalog could (without the hub)."""
    catalog = active_catalog()
    if catalog is None:
        return f" (without the hub, map it to local files with {ENV})"
    return f" ({name} is not in {ENV} {catalog.file})"
