"""Plots from an in-memory runs frame: a curve per row through a series of metrics (``over``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from ablate.reports.plots import curve_points, draw, draw_plots, plot_name
from ablate.reports.spec import ReportSpec
from ablate.reports.tables import aggregate

ACC, MS = "sst2/speed_{}/accuracy", "sst2/speed_{}/latency_ms"


def _runs() -> pd.DataFrame:
    """FastBERT-like runs: L6 twice (seeds), L3 once, L1 without any speed metric."""
    rows = [
        ("L6", {"0": (0.80, 10.0), "0.1": (0.78, 6.0), "0.5": (0.70, 3.0)}),
        ("L6", {"0": (0.82, 12.0), "0.1": (0.78, 6.0)}),  # the second seed skipped 0.5
        ("L3", {"0": (0.75, 5.0), "0.1": (None, 4.0), "0.5": (0.72, 2.0)}),  # no accuracy at 0.1
        ("L1", {}),
    ]
    frame = []
    for i, (variant, speeds) in enumerate(rows):
        run = {"run_id": f"r{i}", "state": "COMPLETE", "variant": variant, "params.backbone": 1e6 * (i + 1)}
        for s, (acc, ms) in speeds.items():
            run |= {ACC.replace("{}", s): acc, MS.replace("{}", s): ms}
        frame.append(run)
    return pd.DataFrame(frame)


def _table(**plot):
    spec = ReportSpec.from_mapping(
        {
            "title": "FastBERT",
            "rows": ["variant"],
            "order": {"variant": ["L6", "L3", "L1"]},
            "metrics": [
                {"name": "params.backbone", "format": "millions"},
                {"name": "sst2/speed_0/accuracy", "label": "full acc", "format": "percent", "better": "higher"},
                {"name": "sst2/speed_0.1/accuracy", "label": "acc @0.1", "format": "percent"},
            ],
            "plots": [{"x": MS, "y": ACC, "over": [0, 0.1, 0.5], **plot}],
        }
    )
    return aggregate(_runs(), spec)


@pytest.fixture()
def figures(monkeypatch):
    """The Figures that ``draw`` saves, to read back what it drew."""
    saved: list[Figure] = []
    save = Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def test_curve_points_follow_over_and_skip_missing_points():
    table = _table()
    points = curve_points(table, table.spec.plots[0])
    assert list(points) == [("L6",), ("L3",)]  # table order; L1 has no point at all
    l6 = points[("L6",)]
    assert [p[0] for p in l6] == ["0", "0.1", "0.5"]
    assert l6[0] == ("0", pytest.approx(11.0), pytest.approx(0.81))  # the mean of both seeds
    assert l6[1] == ("0.1", 6.0, pytest.approx(0.78))
    assert l6[2] == ("0.5", 3.0, pytest.approx(0.70))  # one seed logged it: its value
    assert points[("L3",)] == [("0", 5.0, 0.75), ("0.5", 2.0, 0.72)]  # 0.1 lacks its accuracy


def test_a_curve_per_row_is_drawn(tmp_path, figures):
    table = _table(logx=True)
    path = tmp_path / "curve.png"
    assert draw(table, table.spec.plots[0], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = figures[-1].axes
    lines = {c.get_label(): c for c in ax.containers}
    assert list(lines) == ["variant=L6", "variant=L3"]  # the legend: row text; no Pareto front
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["variant=L6", "variant=L3"]
    l6, l3 = (lines[k].lines[0] for k in lines)
    assert l6.get_linestyle() == "-" and l6.get_marker() != "None"
    assert l6.get_color() != l3.get_color()
    assert l6.get_xydata() == pytest.approx(np.array([[11.0, 81.0], [6.0, 78.0], [3.0, 70.0]]))  # accuracy in %
    assert l3.get_xydata() == pytest.approx(np.array([[5.0, 75.0], [2.0, 72.0]]))
    assert lines["variant=L6"].has_yerr and lines["variant=L6"].has_xerr  # the two seeds of speed 0 differ
    assert not lines["variant=L3"].has_yerr  # a single run: no error bars
    assert [t.get_text() for t in ax.texts] == ["0", "0.1", "0.5", "0", "0.5"]  # each point's over value
    assert ax.get_xlabel() == "sst2/speed_s/latency_ms"
    assert ax.get_ylabel() == "sst2/speed_s/accuracy (%)"  # the percent the named speeds share
    assert ax.get_title() == "FastBERT: sst2/speed_s/accuracy (%) vs sst2/speed_s/latency_ms"
    assert ax.get_xscale() == "log"


def test_a_metric_of_the_exact_name_labels_the_axis(tmp_path, figures):
    spec = ReportSpec.from_mapping(
        {
            "title": "t",
            "rows": ["variant"],
            "metrics": [{"name": "params.backbone"}, {"name": MS, "label": "Latency (ms)", "optional": True}],
            "plots": [{"x": MS, "y": ACC, "over": [0, 0.1, 0.5]}],
        }
    )
    table = aggregate(_runs(), spec)
    assert draw(table, spec.plots[0], tmp_path / "p.png")
    (ax,) = figures[-1].axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Latency (ms)", "sst2/speed_s/accuracy")


def test_draw_plots_names_curves_and_skips_empty_ones(tmp_path):
    table = _table()
    assert plot_name(table.spec.plots[0]) == "sst2_speed_over_accuracy-vs-sst2_speed_over_latency_ms"
    empty = aggregate(_runs().query("variant == 'L1'"), table.spec)
    assert curve_points(empty, empty.spec.plots[0]) == {}
    paths, skipped = draw_plots(empty, tmp_path)
    assert paths == [] and skipped == [f"plot {ACC} vs {MS}: no row has any point"]
    assert not list(tmp_path.iterdir())
    paths, skipped = draw_plots(table, tmp_path)
    assert [p.name for p in paths] == ["sst2_speed_over_accuracy-vs-sst2_speed_over_latency_ms.png"] and not skipped
    assert not math.isnan(table.stats["sst2/speed_0.5/latency_ms.mean"].iloc[0])
