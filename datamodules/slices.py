"""Slices of a file in the data catalog: a split read from part of one file, ``{file: PATH, rows: "A:B"}``
or ``{file: PATH, articles: "A:B"}`` (docs/data.md, "Slices"). The form is checked when the catalog
is read (:func:`split_value`), what the file holds when it is read (:meth:`Slice.take`,
:meth:`Slice.stream`, :meth:`Slice.short`), so every reader counts rows and articles one way."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    import datasets

T = TypeVar("T")
Unit = Literal["rows", "articles"]

_RANGE = re.compile(r"^\s*(\d*)\s*:\s*(\d*)\s*$")
_KINDS: dict[str, tuple[str, ...]] = {"rows": (".tsv", ".csv", ".jsonl", ".json"), "articles": (".json",)}
_FORM = "{file: PATH, rows: 'A:B'} or {file: PATH, articles: 'A:B'}"


class SliceError(ValueError):
    """A slice its file cannot give (past its end, or by a unit the file has not)."""


@dataclass(frozen=True)
class Slice:
    """Part of a file: its ``rows`` or SQuAD ``articles`` from ``start`` to ``stop`` (None: the end)."""

    unit: Unit
    start: int = 0
    stop: int | None = None

    def __str__(self) -> str:
        return f"{self.unit} {self.start}:{'' if self.stop is None else self.stop}"

    @property
    def size(self) -> int | None:
        """How many items the slice holds where the file has them all (None: to the end)."""
        return None if self.stop is None else self.stop - self.start

    def problem(self, total: int) -> str | None:
        """What is wrong with taking this slice of ``total`` items, or None."""
        noun = self.unit if total != 1 else self.unit[:-1]
        if self.start >= total or (self.stop is not None and self.stop > total):
            return f"the file has {total} {noun}"
        return None

    def take(self, items: Sequence[T]) -> list[T]:
        """The slice of ``items`` (all of a file's rows or articles).

        Raises:
            SliceError: the slice reaches past the items' end (see :meth:`problem`).
        """
        problem = self.problem(len(items))
        if problem:
            raise SliceError(problem)
        return list(items[self.start : self.stop])

    def stream(self, rows: datasets.IterableDataset) -> datasets.IterableDataset:
        """The slice of a ``datasets`` iterable dataset of a file's rows (skipped and taken lazily)."""
        if self.start:
            rows = rows.skip(self.start)
        return rows if self.stop is None else rows.take(self.stop - self.start)

    def short(self, read: int) -> str | None:
        """What is wrong when a stream of the slice ended after ``read`` rows, or None."""
        if read == 0 and self.start > 0:
            return f"the file has at most {self.start} rows"
        if self.size is not None and read < self.size:
            return f"the file has {self.start + read} rows"
        return None


@dataclass(frozen=True)
class SplitFiles:
    """A catalog split as written: its files, globs or folders, or one file and its slice."""

    paths: tuple[str, ...]
    slice: Slice | None = None


def parse_range(text: str) -> tuple[int, int | None]:
    """``"A:B"`` as ``(A, B)`` (``A`` 0 and ``B`` None where left out).

    Raises:
        ValueError: not of the form ``A:B`` with non-negative integers, or ``A >= B``.
    """
    found = _RANGE.match(text)
    if found is None:
        raise ValueError(f"{text!r}: not a range; give 'A:B', 'A:' or ':B' (counted from 0, B excluded)")
    start = int(found.group(1) or 0)
    stop = int(found.group(2)) if found.group(2) else None
    if stop is not None and stop <= start:
        raise ValueError(f"{text!r}: an empty range (its end must be past its start)")
    return start, stop


def _kind_of(path: str) -> str:
    suffixes = Path(path).suffixes
    suffixes = suffixes[-2:-1] if suffixes[-1:] == [".gz"] else suffixes[-1:]
    return suffixes[0].lower() if suffixes else ""


def _sliced(value: Mapping[object, object]) -> SplitFiles:
    units = [u for u in ("rows", "articles") if u in value]
    unknown = [str(k) for k in value if k not in ("file", *_KINDS)]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: unknown key; give {_FORM}")
    file = value.get("file")
    if not isinstance(file, str) or not file.strip():
        raise ValueError(f"file: give the one file to slice ({_FORM})")
    if any(c in file for c in "*?["):
        raise ValueError(f"file: {file}: a glob; a slice is of one file")
    if len(units) != 1:
        raise ValueError(f"give one of rows or articles ({_FORM})")
    unit: Unit = "rows" if units[0] == "rows" else "articles"
    given = value[unit]
    if not isinstance(given, str):
        raise ValueError(f"{unit}: {given!r}: give a range as a string, 'A:B' (quoted in YAML)")
    try:
        start, stop = parse_range(given)
    except ValueError as exc:
        raise ValueError(f"{unit}: {exc}") from None
    if _kind_of(file) not in _KINDS[unit]:
        if unit == "articles":
            raise ValueError(f"articles: {file}: not SQuAD's official JSON (.json); a file of rows takes rows: 'A:B'")
        raise ValueError(f"rows: {file}: not a .tsv, .csv, .jsonl or .json file")
    return SplitFiles((file,), Slice(unit, start, stop))


def split_value(value: object) -> SplitFiles:
    """A catalog split as written: a file, glob or folder, a list of them, or a slice of one file.

    Raises:
        ValueError: none of these (a pydantic validator: the catalog names the key).
    """
    if isinstance(value, str):
        return SplitFiles((value,))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return SplitFiles(tuple(value))
    if isinstance(value, dict):
        return _sliced(value)
    raise ValueError(f"{value!r}: give a file, glob or folder, a list of them, or a slice: {_FORM}")


def overlap(a: Slice | None, b: Slice | None) -> Slice | None:
    """What two reads of one file (a slice, or None: the whole file) both read, at least; None where
    they share nothing, both read the whole file, or count by other units."""
    if a is None and b is None:
        return None
    if a is not None and b is not None and a.unit != b.unit:
        return None
    unit = a.unit if a is not None else b.unit if b is not None else "rows"
    start = max(s.start for s in (a, b) if s is not None)
    stops = [s.stop for s in (a, b) if s is not None and s.stop is not None]
    stop = min(stops) if stops else None
    return Slice(unit, start, stop) if stop is None or stop > start else None
