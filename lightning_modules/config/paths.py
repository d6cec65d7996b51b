"""Paths a command will write, checked before it writes anything.

Each check says what is wrong with the path itself (it exists as the wrong kind of thing,
cannot be made, cannot be written), naming the option or config key, and creates nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

from ablate.lightning_modules.config.errors import ConfigError


def _existing_ancestor(path: Path) -> Path:
    """The nearest part of ``path`` (itself or a parent) that exists."""
    at = path
    while not at.exists() and at != at.parent:
        at = at.parent
    return at


def _writable(folder: Path) -> str | None:
    """Why this process cannot create a file in ``folder`` (None: it can). Permission bits do not
    say it for root or for special file systems, so a nameless temporary file is made and dropped."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def _creatable(path: Path, key: str) -> None:
    """``path`` does not exist yet: its nearest existing parent is a folder this process may write in."""
    at = _existing_ancestor(path.parent if path.parent != path else path)
    if not at.is_dir():
        raise ConfigError(f"{key}: {path}: cannot be made: {at} is a file")
    why = _writable(at)
    if why is not None:
        raise ConfigError(f"{key}: {path}: cannot be made: {at} is not writable ({why})")


def output_folder(path: str | Path, key: str, *, empty: bool = False) -> Path:
    """A folder a command writes into: an existing folder (empty, with ``empty``) it may write in,
    or one that can be made. Nothing is created here."""
    path = Path(path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{key}: {path}: is a file, not a folder")
        if empty and any(path.iterdir()):
            raise ConfigError(f"{key}: {path}: already exists and is not empty; give a new or empty folder")
        why = _writable(path)
        if why is not None:
            raise ConfigError(f"{key}: {path}: is not writable ({why})")
        return path
    _creatable(path, key)
    return path


def output_file(path: str | Path, key: str) -> Path:
    """A file a command writes (replacing it if it exists): not a folder, and its folder can be made."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(f"{key}: {path}: is a folder; give a file name")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{key}: {path}: is not writable")
        return path
    _creatable(path, key)
    return path


def kind_problem(path: str | Path, want: Literal["file", "folder"]) -> str | None:
    """What keeps ``path`` from being read as a ``want`` (None: nothing): ``no such file`` (``folder``),
    ``is a folder, not a file`` (and the opposite) or ``cannot be read``. The one wording of these
    problems, wherever a path is read."""
    path = Path(path).expanduser()
    if not path.exists():
        return f"no such {want}"
    actual = "folder" if path.is_dir() else "file"
    if actual != want:
        return f"is a {actual}, not a {want}"
    if not os.access(path, os.R_OK | (os.X_OK if want == "folder" else 0)):
        return "cannot be read"
    return None


def input_file(path: str | Path, key: str) -> Path:
    """A file a command reads: it exists and is a file."""
    problem = kind_problem(path, "file")
    if problem is not None:
        raise ConfigError(f"{key}: {path}: {problem}")
    return Path(path).expanduser()


def input_folder(path: str | Path, key: str) -> Path:
    """A folder a command reads: it exists and is a folder."""
    problem = kind_problem(path, "folder")
    if problem is not None:
        raise ConfigError(f"{key}: {path}: {problem}")
    return Path(path).expanduser()
