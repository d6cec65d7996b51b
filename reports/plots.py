"""One PNG per plot spec: row means of ``y`` against ``x``, with the Pareto front; or, for a plot
with ``over``, one curve per row through its (``x``, ``y``) points at each ``over`` value. Error
bars are each mean's 95% t-interval over its seeds (:mod:`ablate.reports.stats`)."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on save
from matplotlib.ticker import FuncFormatter

from ablate.reports.rows import Key, row_sort_key, row_text
from ablate.reports.spec import PlotSpec, ReportSpec
from ablate.reports.tables import Table

DPI = 150
_MARKERS = "osD^vP*Xhp"

#: One point of a curve: the ``over`` value, then x and y row means (unscaled).
CurvePoint = tuple[str, float, float]


def _scale(spec: ReportSpec, name: str, plot: PlotSpec | None = None) -> tuple[float, str]:
    """Plot millions as M and fractions as %, with the unit in the axis label.

    For an axis of a plot with ``over`` (``name`` holds ``{}``): the label of a spec metric of
    exactly that name, else the name with ``{}`` shown as ``s``; the format of that metric, else
    the one the spec's metrics among the names it takes all share.
    """
    label = spec.axis_label(name)
    m = spec.metric(name)
    if plot is not None and plot.over:
        label = m.display if m else name.replace("{}", "s")
        axis = "x" if name == plot.x else "y"
        formats = {f.format for f in (spec.metric(n) for n in plot.names(axis)) if f is not None}
        fmt = m.format if m else (formats.pop() if len(formats) == 1 else None)
    else:
        fmt = m.format if m else None
    if fmt == "millions":
        return 1e-6, f"{label} (M)"
    if fmt == "percent":
        return 100.0, f"{label} (%)"
    return 1.0, label


def axis_values(table: Table, name: str) -> tuple[pd.Series, pd.Series]:
    """Mean and error bar (the half-width of the 95% t-interval over seeds; 0 where there is none)
    of a metric per row, or the row values of a row param (error 0)."""
    st = table.stats
    if name in table.spec.rows:
        values = pd.to_numeric(st[name], errors="coerce").astype(float)
        return values, pd.Series(0.0, index=st.index)
    if f"{name}.mean" not in st:
        nan = pd.Series(np.nan, index=st.index)
        return nan, nan
    half = st[f"{name}.half_width"].where(st[f"{name}.n"] > 1, 0.0).fillna(0.0)
    return st[f"{name}.mean"].astype(float), half.astype(float)


def pareto_front(x: list[float], y: list[float], higher_is_better: bool) -> list[int]:
    """Indices of the points that no other point beats (smaller x, better y), by x."""
    sign = -1.0 if higher_is_better else 1.0
    order = sorted(range(len(x)), key=lambda i: (x[i], sign * y[i]))
    front: list[int] = []
    best = math.inf
    for i in order:
        if sign * y[i] < best:
            front.append(i)
            best = sign * y[i]
    return front


def slug(name: str) -> str:
    """A file-name-safe version of a metric or param name."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "plot"


def _curves(table: Table, plot: PlotSpec) -> dict[Key, list[tuple[str, float, float, float, float]]]:
    """Per row key (rows without a point left out): (over value, x, y, x error, y error) in ``over`` order."""
    axes = []
    for v, nx, ny in zip(plot.over, plot.names("x"), plot.names("y"), strict=True):
        (x, xerr), (y, yerr) = axis_values(table, nx), axis_values(table, ny)
        axes.append((v, x, y, xerr, yerr))
    curves: dict[Key, list[tuple[str, float, float, float, float]]] = {}
    for i, key in enumerate(table.keys()):
        pts = [
            (v, float(x.iloc[i]), float(y.iloc[i]), float(xe.iloc[i]), float(ye.iloc[i])) for v, x, y, xe, ye in axes
        ]
        if pts := [p for p in pts if not (math.isnan(p[1]) or math.isnan(p[2]))]:
            curves[key] = pts
    return curves


def curve_points(table: Table, plot: PlotSpec) -> dict[Key, list[CurvePoint]]:
    """The points a plot with ``over`` draws: per row key, in table order, its (over value, x mean,
    y mean) in ``over`` order, leaving out values where the row lacks x or y, and rows with no point."""
    return {key: [p[:3] for p in pts] for key, pts in _curves(table, plot).items()}


def _errors(values: list[float], scale: float) -> list[float] | None:
    """Error bar lengths, NaN (none) where the interval is 0; None when no point has one."""
    return [v * scale if v > 0 else math.nan for v in values] if any(v > 0 for v in values) else None


def _draw_curves(table: Table, plot: PlotSpec, ax: Axes, sx: float, sy: float) -> int:
    """One line per row through its points, each labelled with its ``over`` value; the number of lines."""
    curves = _curves(table, plot)
    colors = colormaps["tab20" if len(curves) > 10 else "tab10"]  # no two rows alike (a listed colormap)
    for g, (key, pts) in enumerate(curves.items()):
        over, xs, ys, xe, ye = (list(c) for c in zip(*pts, strict=True))
        ax.errorbar(
            [v * sx for v in xs],
            [v * sy for v in ys],
            xerr=_errors(xe, sx),
            yerr=_errors(ye, sy),
            fmt="-" + _MARKERS[g % len(_MARKERS)],
            color=colors(g % colors.N),
            capsize=3,
            markersize=5,
            linewidth=1.2,
            label=row_text(table.spec, key),
        )
        for v, px, py in zip(over, xs, ys, strict=True):
            ax.annotate(v, (px * sx, py * sy), xytext=(4, 3), textcoords="offset points", fontsize=7, alpha=0.8)
    return len(curves)


def _draw_scatter(table: Table, plot: PlotSpec, ax: Axes, sx: float, sy: float) -> int:
    """Row means as points, coloured by ``hue``, with the Pareto front; the number of groups."""
    spec = table.spec
    x, xerr = axis_values(table, plot.x)
    y, yerr = axis_values(table, plot.y)
    ok = (x.notna() & y.notna()).to_numpy()
    if not ok.any():
        return 0
    keys = table.keys()
    hues = [k[spec.rows.index(plot.hue)] if plot.hue else None for k in keys]
    groups = sorted({h for h, o in zip(hues, ok, strict=True) if o}, key=lambda h: row_sort_key(spec, plot.hue, h))
    colors = colormaps["tab20" if len(groups) > 10 else "tab10"]  # no two groups alike (a listed colormap)
    for g, hue in enumerate(groups):
        idx = [i for i in range(len(keys)) if ok[i] and hues[i] == hue]
        ax.errorbar(
            x.iloc[idx] * sx,
            y.iloc[idx] * sy,
            xerr=(xerr.iloc[idx] * sx).where(lambda s: s > 0) if xerr.iloc[idx].any() else None,
            yerr=(yerr.iloc[idx] * sy).where(lambda s: s > 0) if yerr.iloc[idx].any() else None,
            fmt=_MARKERS[g % len(_MARKERS)],
            color=colors(g % colors.N),
            capsize=3,
            markersize=6,
            label=None if plot.hue is None else str(hue),
        )
        for i in idx:
            ax.annotate(
                row_text(spec, keys[i], skip=plot.hue),
                (x.iloc[i] * sx, y.iloc[i] * sy),
                xytext=(5, 4),
                textcoords="offset points",
                fontsize=7,
                alpha=0.8,
            )

    metric = spec.metric(plot.y)
    if metric is not None and metric.better is not None:
        pts = [i for i in range(len(keys)) if ok[i]]
        xs, ys = [x.iloc[i] for i in pts], [y.iloc[i] for i in pts]
        front = [pts[j] for j in pareto_front(xs, ys, metric.better == "higher")]
        ax.step(
            [x.iloc[i] * sx for i in front],
            [y.iloc[i] * sy for i in front],
            where="post",
            color="0.4",
            linestyle="--",
            linewidth=1,
            marker="o",
            markersize=13,
            markerfacecolor="none",
            label="Pareto front",
            zorder=0,
        )
    return len(groups)


def draw(table: Table, plot: PlotSpec, path: Path) -> bool:
    """Draw one plot to ``path``; False (and no file) when no row has both x and y (with ``over``:
    when no row has any point)."""
    spec = table.spec
    sx, xlabel = _scale(spec, plot.x, plot)
    sy, ylabel = _scale(spec, plot.y, plot)
    fig = Figure(figsize=(6.4, 4.8), dpi=DPI)
    ax = fig.add_subplot()
    entries = (_draw_curves if plot.over else _draw_scatter)(table, plot, ax, sx, sy)
    if not entries:
        return False

    if plot.logx:
        ax.set_xscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.6, 2, 10 rather than 6e-01
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
    ax.margins(x=0.08, y=0.08)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(textwrap.wrap(f"{spec.title}: {ylabel} vs {xlabel}", 70)), fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        title = spec.row_label(plot.hue) if plot.hue and not plot.over else None
        if entries > 6:  # beside the axes, not over the points
            ax.legend(fontsize=8, title=title, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        else:
            ax.legend(fontsize=8, title=title, title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return True


def plot_name(plot: PlotSpec) -> str:
    """The PNG's name without suffix: ``val_mlm_acc-vs-params_backbone``; ``{}`` reads ``over``."""
    return f"{slug(plot.y.replace('{}', 'over'))}-vs-{slug(plot.x.replace('{}', 'over'))}"


def draw_plots(table: Table, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Draw every plot of the spec into ``out_dir``.

    Returns:
        The PNG paths written, and a note for each plot skipped for lack of data.
    """
    paths: list[Path] = []
    skipped: list[str] = []
    for i, plot in enumerate(table.spec.plots):
        name = plot_name(plot)
        path = out_dir / f"{name}.png"
        if path in paths:
            path = out_dir / f"{name}-{i}.png"
        if draw(table, plot, path):
            paths.append(path)
        else:
            lacks = "no row has any point" if plot.over else "no row has both values"
            skipped.append(f"plot {plot.y} vs {plot.x}: {lacks}")
    return paths, skipped
