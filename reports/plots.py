"""One PNG per plot spec: row means of ``y`` against ``x``, with the Pareto front."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on save
from matplotlib.ticker import FuncFormatter

from ablate.reports.spec import PlotSpec, ReportSpec
from ablate.reports.tables import Table, row_sort_key, row_text

DPI = 150
_MARKERS = "osD^vP*Xhp"


def _scale(spec: ReportSpec, name: str) -> tuple[float, str]:
    """Plot millions as M and fractions as %, with the unit in the axis label."""
    label = spec.axis_label(name)
    m = spec.metric(name)
    if m is not None and m.format == "millions":
        return 1e-6, f"{label} (M)"
    if m is not None and m.format == "percent":
        return 100.0, f"{label} (%)"
    return 1.0, label


def _axis(table: Table, name: str) -> tuple[pd.Series, pd.Series]:
    """Mean and std (0 where n <= 1) of a metric, or the row values of a row param."""
    st = table.stats
    if name in table.spec.rows:
        values = pd.to_numeric(st[name], errors="coerce").astype(float)
        return values, pd.Series(0.0, index=st.index)
    if f"{name}.mean" not in st:
        nan = pd.Series(np.nan, index=st.index)
        return nan, nan
    std = st[f"{name}.std"].where(st[f"{name}.n"] > 1, 0.0).fillna(0.0)
    return st[f"{name}.mean"].astype(float), std


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


def draw(table: Table, plot: PlotSpec, path: Path) -> bool:
    """Draw one plot to ``path``; False (and no file) when no row has both x and y."""
    spec = table.spec
    x, xerr = _axis(table, plot.x)
    y, yerr = _axis(table, plot.y)
    ok = (x.notna() & y.notna()).to_numpy()
    if not ok.any():
        return False
    sx, xlabel = _scale(spec, plot.x)
    sy, ylabel = _scale(spec, plot.y)
    keys = table.keys()

    fig = Figure(figsize=(6.4, 4.8), dpi=DPI)
    ax = fig.add_subplot()
    hues = [k[spec.rows.index(plot.hue)] if plot.hue else None for k in keys]
    groups = sorted({h for h, o in zip(hues, ok, strict=True) if o}, key=lambda h: row_sort_key(spec, plot.hue, h))
    colors = colormaps["tab20" if len(groups) > 10 else "tab10"].colors  # no two groups alike
    for g, hue in enumerate(groups):
        idx = [i for i in range(len(keys)) if ok[i] and hues[i] == hue]
        ax.errorbar(
            x.iloc[idx] * sx,
            y.iloc[idx] * sy,
            xerr=(xerr.iloc[idx] * sx).where(lambda s: s > 0) if xerr.iloc[idx].any() else None,
            yerr=(yerr.iloc[idx] * sy).where(lambda s: s > 0) if yerr.iloc[idx].any() else None,
            fmt=_MARKERS[g % len(_MARKERS)],
            color=colors[g % len(colors)],
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
        beside = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0)} if len(groups) > 6 else {}  # not over points
        ax.legend(fontsize=8, title=spec.row_label(plot.hue) if plot.hue else None, title_fontsize=8, **beside)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return True


def draw_plots(table: Table, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Draw every plot of the spec into ``out_dir``.

    Returns:
        The PNG paths written, and a note for each plot skipped for lack of data.
    """
    paths: list[Path] = []
    skipped: list[str] = []
    for i, plot in enumerate(table.spec.plots):
        name = f"{slug(plot.y)}-vs-{slug(plot.x)}"
        path = out_dir / f"{name}.png"
        if path in paths:
            path = out_dir / f"{name}-{i}.png"
        if draw(table, plot, path):
            paths.append(path)
        else:
            skipped.append(f"plot {plot.y} vs {plot.x}: no row has both values")
    return paths, skipped
