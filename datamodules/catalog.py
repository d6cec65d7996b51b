"""The data catalog (``ABLATE_DATA_CATALOG``): ``datasets`` hub names mapped to local copies, and hub
model names to local folders, for machines without the hub; read and checked here, a name matched by
the hub path and config it names however it is spelled (docs/data.md, "The data catalog").
Slices: :mod:`ablate.datamodules.slices`."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PlainValidator, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from ablate.datamodules.slices import Slice, SplitFiles, overlap, split_value
from ablate.lightning_modules.config.errors import STRICT, ConfigError, DataError, format_error
from ablate.lightning_modules.config.load import read_yaml
from ablate.lightning_modules.config.paths import kind_problem
from ablate.lightning_modules.config.tasks import HubName, parse_hub_name

ENV = "ABLATE_DATA_CATALOG"
"""The environment variable naming the catalog file."""

SPLIT = re.compile(r"^[\w.-]+$")
"""A split name (``train``, ``validation``, ``test``)."""
_CONFIG = re.compile(r"^[\w.+-]+$")
_LOCAL_SUFFIXES = (".txt", ".json", ".jsonl", ".parquet", ".gz", ".tsv", ".csv", ".tar", ".zip")


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


def model_name_problem(name: str) -> str | None:
    """What makes ``name`` no valid hub model name (``name`` or ``owner/name``, checked offline), or None."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # a lazy, unmarked re-export

    try:
        validate_repo_id(name)
    except HFValidationError as exc:
        return f"not a hub model name ({name!r}: {str(exc).split(': ')[0]})"
    return None


def _problem(file: Path, message: str) -> ConfigError:
    return ConfigError(f"{ENV}: {file}: {message}")


@pydantic_dataclass(frozen=True, config=STRICT)
class _CatalogFile:
    """The catalog file as written: ``datasets``, hub name -> split -> path(s) or a slice of a file;
    ``models``, hub model name -> folder."""

    datasets: dict[str, dict[str, Annotated[SplitFiles, PlainValidator(split_value)]]] = Field(default_factory=dict)
    models: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class Catalog:
    """A loaded catalog.

    Attributes:
        file: the catalog file (absolute).
        names: each dataset's name as the catalog writes it, by what it names.
        entries: each dataset's splits, as absolute paths or globs, by what it names.
        models: each hub model name's local folder (absolute), by the name as written.
        slices: the splits read from part of their one file, by what the dataset names and the split.
    """

    file: Path
    names: Mapping[HubName, str]
    entries: Mapping[HubName, Mapping[str, tuple[str, ...]]]
    models: Mapping[str, Path] = field(default_factory=dict)
    slices: Mapping[HubName, Mapping[str, Slice]] = field(default_factory=dict)

    def slice_of(self, name: str, split: str) -> Slice | None:
        """The part of its file that ``name``'s ``split`` reads, or None: all of its files."""
        return self.slices.get(parse_hub_name(name), {}).get(split)

    def model(self, name: str) -> Path | None:
        """The local folder the catalog maps hub model ``name`` to, or None when it does not."""
        return self.models.get(name.strip())

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
        what = "a catalog: datasets: {HUB_NAME: {SPLIT: FILES}}, models: {HUB_NAME: FOLDER}"
        raw: dict[str, Any] = read_yaml(file, what=what)  # validated by _CatalogFile
        parsed = _CatalogFile(**raw)
    except ConfigError as exc:
        raise ConfigError(f"{ENV}: {exc}") from None
    except ValidationError as exc:
        raise _problem(file, format_error(exc)) from None
    except TypeError as exc:
        raise _problem(file, str(exc)) from None
    names, entries, slices = _datasets(file, parsed.datasets)
    models: dict[str, Path] = {}
    for name, folder in parsed.models.items():
        where = f"models.{name}"
        problem = "a local path, not a hub model name" if looks_local(name) else model_name_problem(name)
        if problem:
            raise _problem(file, f"{where}: {problem}")
        if not folder.strip():
            raise _problem(file, f"{where}: empty; give the model's local folder")
        models[name.strip()] = Path(_absolute(file, folder))
    return Catalog(file, names, entries, models, slices)


_Datasets = tuple[dict[HubName, str], dict[HubName, dict[str, tuple[str, ...]]], dict[HubName, dict[str, Slice]]]


def _datasets(file: Path, datasets: dict[str, dict[str, SplitFiles]]) -> _Datasets:
    """The catalog's ``datasets`` checked: names, each one's splits' absolute paths, and its slices."""
    names: dict[HubName, str] = {}
    entries: dict[HubName, dict[str, tuple[str, ...]]] = {}
    slices: dict[HubName, dict[str, Slice]] = {}
    for name, splits in datasets.items():
        where = f"datasets.{name}"
        problem = "a local path, not a hub name" if looks_local(name) else hub_form_problem(name)
        if problem:
            raise _problem(file, f"{where}: {problem}")
        hub = parse_hub_name(name)
        if hub in names:
            raise _problem(file, f"{where}: the same dataset as {names[hub]}")
        if not splits:
            raise _problem(file, f"{where}: no split; give its splits' files (train: FILES, ...)")
        entries[hub], slices[hub] = {}, {}
        for split, given in splits.items():
            if not SPLIT.match(split):
                raise _problem(file, f"{where}.{split}: not a split name (letters, digits, _ . -)")
            if not given.paths or any(not p.strip() for p in given.paths):
                raise _problem(file, f"{where}.{split}: empty; give a file, glob or folder")
            entries[hub][split] = tuple(_absolute(file, p) for p in given.paths)
            if given.slice is not None:
                slices[hub][split] = given.slice
        names[hub] = name
        _note_overlaps(file, where, entries[hub], slices[hub])
    return names, entries, slices


def _note_overlaps(file: Path, where: str, paths: Mapping[str, tuple[str, ...]], slices: Mapping[str, Slice]) -> None:
    """A warning where the ``train`` split and another of a dataset, one of them a slice, read the same
    part of a file: allowed (a smoke run may train on its dev set), but seldom meant."""
    for other in (s for s in paths if s != "train" and "train" in paths):
        common = overlap(slices.get("train"), slices.get(other))
        shared = sorted(set(paths["train"]) & set(paths[other]))
        if common is not None and shared:
            note = (
                f"train and {other} both read {common} of {shared[0]} (a model would be scored on what it trained on)"
            )
            logging.getLogger(__name__).warning("%s: %s: %s: %s", ENV, file, where, note)


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


RUNS = "runs:/"
"""A source named by its MLflow run (``runs:/RUN_ID``), not by a folder or hub name."""
MODEL_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "model.safetensors",
)
"""What is fetched of a hub model: its config, tokenizer files and safetensors weights (never the
TensorFlow, Flax or ONNX copies many repositories also hold)."""


def _mapped(name: str, field: str) -> Path | None:
    """The catalog's folder for hub model ``name`` (checked to exist), or None when it maps none."""
    catalog = active_catalog()
    folder = catalog.model(name) if catalog is not None else None
    problem = kind_problem(folder, "folder") if catalog is not None and folder is not None else None
    if catalog is not None and problem is not None:
        raise DataError(f"{field}: {name}: {ENV}: {catalog.file}: models.{name}: {folder}: {problem}")
    return folder


def check_model(name: str, field: str) -> None:
    """Offline: ``name`` (a checkpoint or tokenizer ``field`` names) is an existing folder, the data
    catalog's model entry of an existing folder, a well-formed hub model name or ``runs:/RUN_ID``.

    Raises:
        DataError: the catalog maps ``name`` to a missing folder.
        ConfigError: a name written as a path is no folder; a name that is no hub model name either.
    """
    if name.startswith(RUNS) or Path(name).expanduser().is_dir() or _mapped(name, field) is not None:
        return
    kind = "tokenizer" if field.endswith("tokenizer") else "checkpoint"
    exists = Path(name).expanduser().exists()
    problem = f"is a file, not a {kind} folder" if exists else None
    problem = problem or (f"no such {kind} folder" if looks_local(name) else model_name_problem(name))
    if problem:
        raise ConfigError(f"{field}: {name}: {problem}")


def resolve_model(name: str, field: str, weights: bool = True) -> Path:
    """The local folder of the checkpoint or tokenizer ``name`` (``field`` names it in errors): a
    folder as it is, else the data catalog's ``models:`` entry, else a hub model from the hub cache,
    downloaded there (config, tokenizer files and, with ``weights``, the weights) unless the hub is
    offline (``HF_HUB_OFFLINE``).

    Raises:
        ConfigError / DataError: as :func:`check_model`; a hub name the cache lacks while offline, or
            the hub does not give.
    """
    check_model(name, field)
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder
    mapped = _mapped(name, field)
    if mapped is not None:
        return mapped
    from huggingface_hub import constants, snapshot_download

    files = list(MODEL_FILES if weights else MODEL_FILES[:-1])
    try:  # the hub cache first: no network
        return Path(snapshot_download(name, allow_patterns=files, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or incompletely): fetch it, where the hub is reachable
        if constants.is_offline_mode():
            raise ConfigError(
                f"{field}: {name}: not in the hub cache and the hub is offline (HF_HUB_OFFLINE); map it to a "
                f"local folder in the data catalog's models: ({ENV})"
            ) from None
    try:
        found = Path(snapshot_download(name, allow_patterns=files))
        if weights and not (found / MODEL_FILES[-1]).is_file():  # an older repository: PyTorch's pickle only
            found = Path(snapshot_download(name, allow_patterns=[*files, "pytorch_model.bin"]))
    except Exception as exc:  # noqa: BLE001 - unreachable, unknown, gated: one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        hint = hub_hint(name)
        raise ConfigError(
            f"{field}: {name}: not a local folder, and the hub does not give it ({first}){hint}"
        ) from None
    return found
