"""A fine-tuning task's rows: its splits resolved (training, the dev set, further dev sets such as
MNLI's mismatched one), their columns read through ``datasets`` (TSVs as GLUE's copies are written:
docs/data.md), and their labels checked for the task's kind. :func:`check_task_data` reads only the
labels and headers of the splits held locally, so a study is refused a missing column or a bad
label before any of its runs exists."""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import datasets

from ablate.datamodules.catalog import hub_hint
from ablate.datamodules.sources import TaskData, resolve_task
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.finetune import FinetuneConfig

READ_BATCH = 8192
"""Rows per batch pulled from ``datasets``."""

Labels = list[int] | list[float]
"""A split's labels: classes (classification) or numbers (regression)."""


@dataclass(frozen=True)
class Schema:
    """What a task reads from each row: its label column, its text columns, and what the labels are."""

    label_field: str
    text_fields: tuple[str, ...]
    kind: str
    num_labels: int

    @classmethod
    def of(cls, cfg: FinetuneConfig) -> Schema:
        return cls(cfg.label_field, cfg.text_fields, cfg.kind, cfg.num_labels)


def _where(src: TaskData) -> str:
    """The section that names ``src`` (``finetune``, ``tasks[0]``): its key's first part."""
    return src.key.split(".", 1)[0]


def splits(cfg: FinetuneConfig, prefix: str = "finetune") -> tuple[TaskData, list[tuple[str, TaskData]]]:
    """The training split and the dev sets (name -> split: the task's own first, then
    ``extra_validation``'s) of a ``finetune`` section; ``prefix`` names it in errors.

    Raises:
        ConfigError: ``train`` unset; a local training file without ``validation``; a further dev set
            without data of its own beside a local dev file.
        DataError: a local file (or the catalog's copy) is missing (:func:`resolve_task`).
    """
    if cfg.train is None:
        raise ConfigError(f"{prefix}.train: required to fine-tune (a data file or a hub name)")
    train = resolve_task(f"{prefix}.train", cfg.train, cfg.train_split, "train")
    if cfg.validation is None and train.is_file:
        raise ConfigError(f"{prefix}.validation: required for a local train file")
    dev_data = cfg.validation or cfg.train
    dev = [(cfg.task, resolve_task(f"{prefix}.validation", dev_data, cfg.validation_split, "validation"))]
    for i, extra in enumerate(cfg.extra_validation):
        key = f"{prefix}.extra_validation[{i}]"
        if extra.data is None and dev[0][1].is_file and extra.split is None:
            raise ConfigError(f"{key}.data: required beside a local dev file ({dev_data})")
        dev.append((extra.name, resolve_task(f"{key}.data", extra.data or dev_data, extra.split, "validation")))
    return train, dev


def _missing(src: TaskData, field: str, column: str, found: list[str]) -> DataError:
    """The error of a column the task names (``field``) that ``src`` lacks."""
    split = "" if src.is_file else f"{src.split} split; "
    return DataError(
        f"{_where(src)}.{field}: {column!r} is not a column of {src.name} ({split}columns: {', '.join(found)})"
    )


def _csv_options(src: TaskData) -> dict[str, str | int | bool]:
    """``datasets``' csv reader options for ``src``'s local files (none for other builders)."""
    if src.builder != "csv":
        return {}
    if ".tsv" in Path(src.files[0]).suffixes:  # GLUE's TSVs: no quoting, a backslash escaped as \\
        return {"delimiter": "\t", "quoting": 3, "escapechar": "\\", "na_filter": False}
    return {"delimiter": ",", "quoting": 3, "na_filter": False}  # "NA", "null" are sentences too


def _by_rows(src: TaskData) -> None:
    """Refuse a catalog slice of ``src``'s file by articles (SQuAD's): a task of rows reads rows."""
    if src.slice is not None and src.slice.unit != "rows":
        raise src.slice_error("a task of rows reads rows: 'A:B' (articles are SQuAD's)")


def local_rows(src: TaskData, **options: object) -> datasets.IterableDataset:
    """A streaming ``datasets`` dataset of the rows of ``src``'s local files, or of the catalog's slice
    of its file; ``options`` go to the reader (``usecols``).

    Raises:
        DataError: the catalog slices the file by articles (SQuAD's), not rows.
    """
    _by_rows(src)
    options |= _csv_options(src)
    ds = datasets.load_dataset(src.builder, data_files=list(src.files), split="train", streaming=True, **options)
    return ds if src.slice is None else src.slice.stream(ds)


def check_read(src: TaskData, read: int, limit: int | None) -> None:
    """Raise where ``src``'s slice reaches past its file's end: ``read`` rows came before the stream
    ended (it ends early only at ``limit``).

    Raises:
        DataError: naming the setting, the catalog and the slice, and how many rows the file has.
    """
    problem = src.slice.short(read) if src.slice is not None and (limit is None or read < limit) else None
    if problem:
        raise src.slice_error(problem)


def read_columns(src: TaskData, columns: list[str], limit: int | None, fields: list[str]) -> dict[str, list[object]]:
    """The ``columns`` of a split (its first ``limit`` rows), read through ``datasets``; ``fields``
    names each column's setting (``label_field``, ``text_fields``) for the error of a missing one.

    Raises:
        DataError: the split cannot be read, is empty, or lacks one of ``columns``.
    """
    if src.files and os.path.getsize(src.files[0]) == 0:
        raise DataError(f"{src.key}: {src.name}: no examples")
    columns = list(dict.fromkeys(columns))  # the label first, then the text fields
    found: list[str] | None = None
    out: dict[str, list[object]] = {c: [] for c in columns}
    _by_rows(src)  # its own error, not the reading's
    try:
        ds: Any = local_rows(src) if src.files else datasets.load_dataset(src.builder, src.config, split=src.split)
        for batch in ds.iter(batch_size=READ_BATCH):
            found = found or list(batch)
            if any(c not in batch for c in columns):
                break
            n = len(batch[columns[0]])
            take = n if limit is None else min(n, limit - len(out[columns[0]]))
            for c in columns:
                out[c].extend(batch[c][:take])
            if limit is not None and len(out[columns[0]]) >= limit:
                break
    except Exception as exc:  # noqa: BLE001 - any failure to read is the data's problem
        what = "cannot read" if src.files else f"cannot load the hub dataset's {src.split!r} split"
        first = (str(exc).splitlines() or [""])[0] + ("" if src.files else hub_hint(src.name))
        raise DataError(f"{src.key}: {src.name}: {what}: {type(exc).__name__}: {first}") from None
    for c, field in zip(columns, fields, strict=False):
        if found is not None and c not in found:
            raise _missing(src, field, c, found)
    check_read(src, len(out[columns[0]]), limit)
    if not out[columns[0]]:
        raise DataError(f"{src.key}: {src.name}: no examples")
    return out


def _number(value: object) -> float | None:
    """A regression label as a finite float (a number, or a number's text: a column holding one bad
    label reads as text), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def check_labels(src: TaskData, labels: list[object], cfg: Schema) -> Labels:
    """``labels`` checked for the task's kind: classes are integers in ``[0, num_labels)``, regression
    targets finite numbers (returned as floats).

    Raises:
        DataError: naming the setting and the file, the first bad label and its row.
    """
    where = _where(src)
    if cfg.kind == "regression":
        scores = [_number(v) for v in labels]
        for row, (v, score) in enumerate(zip(labels, scores, strict=True), 1):
            if score is None:
                raise DataError(
                    f"{where}.label_field: {src.name} has a label {v!r} (row {row}) that is not a number "
                    f"(finetune.kind regression: {cfg.label_field!r} holds a score)"
                )
        return [score for score in scores if score is not None]
    for row, v in enumerate(labels, 1):
        if isinstance(v, bool) or not isinstance(v, int):
            raise DataError(f"{where}.label_field: {src.name} has a non-integer label {v!r} (row {row})")
        if not 0 <= v < cfg.num_labels:
            raise DataError(f"{where}.num_labels: {src.name} has label {v} (row {row}) outside [0, {cfg.num_labels})")
    return cast(list[int], labels)  # checked above: every one an int


def read_split(src: TaskData, cfg: Schema, limit: int | None) -> tuple[list[list[str]], Labels]:
    """A split's text columns (``None`` read as empty) and its checked labels."""
    fields = ["label_field", *["text_fields"] * len(cfg.text_fields)]
    cols = read_columns(src, [cfg.label_field, *cfg.text_fields], limit, fields)
    labels = check_labels(src, cols[cfg.label_field], cfg)
    texts = [["" if t is None else str(t) for t in cols[f]] for f in cfg.text_fields]
    return texts, labels


def _raw_header(src: TaskData) -> None:
    """A TSV's or CSV's header names each column once (``datasets`` would rename a second ``label`` to
    ``label.1``, and the task read the first silently): DataError naming the file and the column."""
    path = Path(src.files[0])
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        names = fh.readline().rstrip("\r\n").split(str(_csv_options(src)["delimiter"]))
    seen = [n for i, n in enumerate(names) if n in names[:i]]
    if seen:
        raise DataError(f"{src.key}: {src.files[0]}: the header names column {seen[0]!r} twice ({', '.join(names)})")


def _header(src: TaskData) -> list[str]:
    """The column names of a split's first local file (its first row's keys)."""
    if src.builder == "csv":
        _raw_header(src)
    try:
        ds: Any = datasets.load_dataset(
            src.builder, data_files=list(src.files[:1]), split="train", streaming=True, **_csv_options(src)
        )
        return list(next(iter(ds), {}))
    except Exception as exc:  # noqa: BLE001 - any failure to read is the data's problem
        first = (str(exc).splitlines() or [""])[0]
        raise DataError(f"{src.key}: {src.name}: cannot read: {type(exc).__name__}: {first}") from None


@lru_cache(maxsize=256)
def _check_split(src: TaskData, stamp: tuple[tuple[int, int], ...], cfg: Schema, limit: int | None) -> None:
    """:func:`check_task_data` for one split (cached by its files' sizes and times: a study's trials share it)."""
    header = _header(src)
    for c, field in ((cfg.label_field, "label_field"), *((t, "text_fields") for t in cfg.text_fields)):
        if header and c not in header:
            raise _missing(src, field, c, header)
    if src.builder == "csv":  # the labels alone: a study's check reads no text
        ds: Any = local_rows(src, usecols=[cfg.label_field])
        labels: list[Any] = []
        try:
            for batch in ds.iter(batch_size=READ_BATCH):
                labels.extend(batch[cfg.label_field])
                if limit is not None and len(labels) >= limit:
                    break
        except Exception as exc:  # noqa: BLE001 - any failure to read is the data's problem
            first = (str(exc).splitlines() or [""])[0]
            raise DataError(f"{src.key}: {src.name}: cannot read: {type(exc).__name__}: {first}") from None
        check_read(src, len(labels), limit)
        if not labels:
            raise DataError(f"{src.key}: {src.name}: no examples")
        check_labels(src, labels[:limit], cfg)
    else:
        read_split(src, cfg, limit)


def check_task_data(cfg: FinetuneConfig, prefix: str = "finetune") -> None:
    """Check a task's data before anything runs: every split held locally (a file, or the data
    catalog's copy of a hub name) has the named columns and labels valid for the task's kind (the
    first ``train_examples`` / ``validation_examples`` rows, those a run reads). Hub names held
    nowhere locally are left to the run (reading them downloads them).

    Raises:
        ConfigError, DataError: one line naming the setting and the file.
    """
    train, dev = splits(cfg, prefix)
    for src, limit in ((train, cfg.train_examples), *((d, cfg.validation_examples) for _, d in dev)):
        if src.files:
            stamp = tuple((os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in src.files)
            _check_split(src, stamp, Schema.of(cfg), limit)
