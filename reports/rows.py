"""A table's rows: their keys (the row params' values), their order and text, and the reference row."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import cast

import pandas as pd

from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports.spec import ReportSpec

Value = str | int | float | bool | None
"""A row param's value in a row key: as a report reads params back, numpy scalars as Python's, NaN as None."""
Key = tuple[Value, ...]
"""A row key: the row params' values, in the spec's row order."""
SortKey = tuple[object, ...]
"""What rows are sorted by (:func:`natural_key`, :func:`row_sort_key`)."""


def clean_value(v: object) -> Value:
    """Numpy scalars -> Python, NaN -> None, so keys hash and print cleanly."""
    if hasattr(v, "item"):
        v = v.item()
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return cast(Value, v)  # a param as read back: a string or a number


def clean_key(values: Iterable[object]) -> Key:
    """A row key: the row params' values, numpy scalars as Python's, NaN as None."""
    return tuple(clean_value(v) for v in values)


def key_column(values: list[Value]) -> pd.Series:
    """Row-key values as a column; ints stay ints even next to None (no 128 -> 128.0)."""
    column = pd.Series(values, dtype=object)
    return column if any(v is None for v in values) else column.infer_objects()


def natural_key(value: object) -> SortKey:
    """Sort numbers numerically, then strings naturally (``l2`` < ``l10``), then None."""
    value = clean_value(value)
    if value is None:
        return (2,)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value))
    parts = re.split(r"(\d+)", str(value))
    return (1, tuple(int(p) if i % 2 else p.lower() for i, p in enumerate(parts)))


def row_sort_key(spec: ReportSpec, row: str | None, value: object) -> SortKey:
    """Sort key of one row param's value: its place in ``spec.order[row]``, then natural order."""
    listed = [clean_value(v) for v in spec.order.get(row or "", ())]
    value = clean_value(value)
    return (listed.index(value), ()) if value in listed else (len(listed), natural_key(value))


def row_text(spec: ReportSpec, key: Key, skip: str | None = None) -> str:
    """``sharing=all E=64 F=1`` for a row key."""
    return " ".join(f"{spec.row_label(r)}={v}" for r, v in zip(spec.rows, key, strict=True) if r != skip)


def reference_text(spec: ReportSpec) -> str:
    """The reference row as the spec names it: ``sharing=none E=128``, ``the first row``."""
    if isinstance(spec.reference, dict):
        return " ".join(f"{spec.row_label(r)}={spec.reference[r]}" for r in spec.rows if r in spec.reference)
    return "the first row" if spec.reference == "first" else "none"


def _same(value: object, wanted: object) -> bool:
    return bool(clean_value(value) == wanted or str(clean_value(value)) == str(wanted))


def reference_row(spec: ReportSpec, keys: list[Key], runs: list[int]) -> int | None:
    """Position of the row ``spec.reference`` names, among rows with runs (``runs``: per row);
    None when it names none, or no such row has runs.

    Raises:
        ConfigError: a ``reference`` mapping matches more than one row.
    """
    if spec.reference == "none":
        return None
    if spec.reference == "first":
        return next((i for i, k in enumerate(runs) if k > 0), None)
    wanted = [(spec.rows.index(r), v) for r, v in spec.reference.items()]
    found = [i for i, key in enumerate(keys) if all(_same(key[j], v) for j, v in wanted)]
    if len(found) > 1:
        rows = "; ".join(row_text(spec, keys[i]) for i in found)
        raise ConfigError(
            f"report.reference: {reference_text(spec)} matches {len(found)} rows ({rows}); name more of rows"
        )
    return found[0] if found and runs[found[0]] > 0 else None
