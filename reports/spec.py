"""Report specs: which rows, metrics and plots a paper-style table shows. A spec is the ``report:``
section of a study YAML, or a standalone REPORT.yaml that also names ``study:`` and optionally
``tracking_uri:`` (examples: docs/studies.md, "A study file", and docs/reports.md, "Plots")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT, ConfigError, FieldError, format_error, spec_keys
from ablate.lightning_modules.config.load import read_yaml
from ablate.lightning_modules.config.metric_names import check_name

Format = Literal["millions", "percent", "float", "int", "sci"]
State = Literal["COMPLETE", "PRUNED", "FAIL"]

#: Digits after the decimal point when a metric gives none.
DEFAULT_DIGITS: dict[str, int] = {"millions": 1, "percent": 1, "float": 3, "int": 0, "sci": 2}


def _unique(values: list[str] | tuple[str, ...], what: str) -> None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise FieldError(f"{what}[{i}]", f"{v!r} is listed twice")
        seen.add(v)


@dataclass(frozen=True, config=STRICT)
class MetricSpec:
    """One metric column.

    Attributes:
        name: MLflow metric name, e.g. ``val/mlm_acc`` or ``params.backbone``.
        label: Column header; defaults to ``name``.
        format: ``millions`` (12.0M), ``percent`` (fraction shown as 61.2),
            ``float``, ``int`` or ``sci``.
        digits: Digits after the point; default depends on ``format``.
        better: ``higher`` or ``lower`` bolds the best cell; None bolds nothing.
        optional: Only some rows' runs log it (``quant/mlm_acc_drop``: quantized runs): their
            other cells are empty (–) without being reported missing.
    """

    name: str = Field(min_length=1)
    label: str | None = None
    format: Format = "float"
    digits: int | None = Field(default=None, ge=0, le=12)
    better: Literal["higher", "lower"] | None = None
    optional: bool = False

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        try:  # the names runs log, from ablate.lightning_modules.config.metric_names
            check_name(name)
        except ValueError as exc:
            raise ValueError(f"{exc}; runs log e.g. val/mlm_acc, <task>/best_accuracy, params.backbone") from None
        return name

    @property
    def display(self) -> str:
        """The header text: ``label`` or ``name``."""
        return self.label or self.name

    @property
    def ndigits(self) -> int:
        """Digits after the point actually used."""
        return DEFAULT_DIGITS[self.format] if self.digits is None else self.digits


@dataclass(frozen=True, config=STRICT)
class PlotSpec:
    """One plot of row means: a scatter of ``y`` against ``x``, or with ``over`` a curve per row.

    Attributes:
        x: A metric name (e.g. ``params.backbone``) or one of the spec's ``rows``; with
            ``over``, a metric name holding ``{}`` once (``sst2/speed_{}/latency_ms``).
        y: A metric name (e.g. ``val/mlm_acc``); with ``over``, holding ``{}`` once.
        logx: Logarithmic x axis.
        hue: One of the spec's ``rows``; points are coloured by its value (a curve plot
            gives every row its own colour and does not use it).
        over: Values put in place of ``{}`` in ``x`` and ``y``: each row gets one line
            through the points (``x`` at v, ``y`` at v) for v in this order. Numbers are
            written as ``f"{v:g}"`` (0 -> ``0``, 0.1 -> ``0.1``, 1.0 -> ``1``).
    """

    x: str = Field(min_length=1)
    y: str = Field(min_length=1)
    logx: bool = False
    hue: str | None = None
    over: tuple[str, ...] = ()

    @field_validator("over", mode="before")
    @classmethod
    def _numbers_as_logged(cls, over: object) -> object:
        if isinstance(over, (list, tuple)):
            return tuple(f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in over)
        return over

    @model_validator(mode="after")
    def _placeholders(self) -> PlotSpec:
        for i, v in enumerate(self.over):
            if not v:
                raise FieldError(f"over[{i}]", "must be non-empty")
        _unique(self.over, "over")
        for axis, name in (("x", self.x), ("y", self.y)):
            if self.over and name.count("{}") != 1:
                raise FieldError(axis, f"{name!r} must hold {{}} exactly once (where the over values go)")
            if not self.over and "{}" in name:
                raise FieldError(axis, f"{name!r} holds {{}} but the plot has no over values")
        return self

    def names(self, axis: str) -> list[str]:
        """The metric names of ``x`` or ``y`` (``axis``): one per ``over`` value, in order,
        else just the name."""
        name = self.x if axis == "x" else self.y
        return [name.replace("{}", v) for v in self.over] if self.over else [name]


@dataclass(frozen=True, config=STRICT)
class ReportSpec:
    """A paper-style table (and plots) built from a study's MLflow runs.

    Attributes:
        title: First line of the report.
        rows: Dotted param names whose values identify a table row; runs that
            differ only in other params (seeds) are averaged.
        metrics: Metric columns, in order.
        plots: Plots to draw.
        include_states: Trial states (``ablate.state`` tag) that count.
        row_labels: Optional headers for row and detail columns (default: last dotted part).
        details: Params shown as text columns after the row keys, not grouping runs: the
            distinct values among a row's included runs (e.g. ``pruned.dims``, the shape a
            pruning run found).
        order: Row order for a row param: its values listed first, in this order (e.g. a study's
            variants as declared); other values follow, naturally sorted (the default for all).
        reference: The row the others are tested against (:mod:`ablate.reports.stats`): a cell
            within noise of the reference row's is marked ``≈``. ``first`` (the default): the
            table's first row with runs; a mapping of row params to values (``{model.sharing:
            none, model.embed_dim: 128}``; the row it matches, which must be one: a param left
            out matches any value); ``none``: no row, nothing marked.
        study: Study name (standalone REPORT.yaml only).
        tracking_uri: MLflow tracking URI (standalone REPORT.yaml only).
    """

    title: str = Field(min_length=1)
    rows: tuple[str, ...] = Field(min_length=1)
    metrics: tuple[MetricSpec, ...] = Field(min_length=1)
    plots: tuple[PlotSpec, ...] = ()
    include_states: tuple[State, ...] = Field(default=("COMPLETE",), min_length=1)
    row_labels: dict[str, str] = Field(default_factory=dict)
    details: tuple[str, ...] = ()
    order: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    reference: Literal["first", "none"] | dict[str, Any] = "first"
    study: str | None = None
    tracking_uri: str | None = None

    @field_validator("reference", mode="before")
    @classmethod
    def _reference_kind(cls, value: object) -> object:
        if isinstance(value, Mapping) or value in ("first", "none"):
            return value
        raise ValueError(f"{value!r}: give first, none or a mapping of row params to values ({{model.sharing: none}})")

    @field_validator("rows")
    @classmethod
    def _rows_unique(cls, rows: tuple[str, ...]) -> tuple[str, ...]:
        for r in rows:
            if not r.strip():
                raise ValueError("row names must be non-empty")
        if len(set(rows)) != len(rows):
            raise ValueError(f"duplicate row names in {list(rows)}")
        return rows

    @model_validator(mode="after")
    def _cross_checks(self) -> ReportSpec:
        _unique([m.name for m in self.metrics], "metrics")
        for key in self.row_labels:
            if key not in (*self.rows, *self.details):
                raise FieldError(
                    f"row_labels.{key}", f"not one of rows {list(self.rows)} or details {list(self.details)}"
                )
        headers = [("rows", self.row_label(r)) for r in self.rows]
        headers += [("details", self.row_label(d)) for d in self.details]
        headers += [(f"metrics[{i}].label", m.display) for i, m in enumerate(self.metrics)]
        seen: dict[str, str] = {}
        for key, header in headers:
            if header in seen:
                raise FieldError(
                    key,
                    f"column header {header!r} is used twice (also by {seen[header]}); "
                    "give one of them a label (row_labels or label)",
                )
            seen[header] = key
        for key in self.order:
            if key not in self.rows:
                raise FieldError(f"order.{key}", f"not one of rows {list(self.rows)}")
        if isinstance(self.reference, dict):
            if not self.reference:
                raise FieldError("reference", "names no row param; give e.g. {model.sharing: none}, first or none")
            for key in self.reference:
                if key not in self.rows:
                    raise FieldError(f"reference.{key}", f"not one of rows {list(self.rows)}")
        for i, p in enumerate(self.plots):
            if p.hue is not None and p.hue not in self.rows:
                raise FieldError(f"plots[{i}].hue", f"{p.hue!r} is not one of rows {list(self.rows)}")
            if p.y in self.rows:
                raise FieldError(f"plots[{i}].y", f"{p.y!r} is a row param; y must be a metric")
        return self

    # ------------------------------------------------------------------ helpers
    def row_label(self, key: str) -> str:
        """Header for a row column: ``row_labels[key]`` or the last dotted part."""
        return self.row_labels.get(key) or key.rsplit(".", 1)[-1]

    def metric(self, name: str) -> MetricSpec | None:
        """The spec's metric called ``name``, if any."""
        return next((m for m in self.metrics if m.name == name), None)

    def axis_label(self, name: str) -> str:
        """A readable label for a plot axis (metric label, row label or name)."""
        if name in self.rows:
            return self.row_label(name)
        m = self.metric(name)
        return m.display if m else name

    @classmethod
    def from_mapping(cls, data: object, where: str = "report") -> ReportSpec:
        """Validate a mapping into a spec.

        Args:
            data: The parsed YAML mapping.
            where: Dotted prefix for error messages (``report`` in a study YAML).

        Raises:
            ConfigError: naming the offending key, e.g. ``report.metrics[2].name: ...``.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
        try:
            return _ADAPTER.validate_python(dict(data))
        except ValidationError as exc:
            raise ConfigError(format_error(exc, where, known=spec_keys(ReportSpec))) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> ReportSpec:
        """Read a standalone REPORT.yaml (top level = the spec, plus ``study``).

        Raises:
            ConfigError: unreadable file, bad YAML, or invalid spec (named by file).
        """
        data = read_yaml(path, what="a report spec mapping")
        return cls.from_mapping(data, where=str(path))


_ADAPTER: TypeAdapter[ReportSpec] = TypeAdapter(ReportSpec)
