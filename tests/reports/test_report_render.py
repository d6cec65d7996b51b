"""Rendering a report table (reports/render.py): cells, bold best values, Markdown, LaTeX and CSV."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pandas as pd
import pytest

from ablate.reports.render import format_cell, to_csv, to_latex, to_markdown
from ablate.reports.rows import natural_key
from ablate.reports.runs import load_runs
from ablate.reports.spec import MetricSpec, ReportSpec
from ablate.reports.tables import aggregate
from tests.reports.report_fixtures import STUDY


@pytest.fixture(scope="module")
def runs(store):
    return load_runs(store.uri, STUDY)[0]


def test_markdown_and_latex_bold_the_best(runs, spec):
    table = aggregate(runs, spec)
    md = to_markdown(table)
    assert md.splitlines()[0] == "| sharing | E | F | Params | MLM acc | SOP acc | Val loss | runs |"
    # two seeds: t(0.975, 1) = 12.706, s = 0.01 * sqrt(2): half-width 12.706 * 0.01 = 0.127 (12.7 points)
    cell = "**66.0 ± 12.7 (med 66.0, n=2)≈**"  # within noise of the first row (all 64): Welch p = 0.07
    assert f"| none | 64 | 1 | 11.2M | {cell} | **85.0 ± 12.7 (med 85.0, n=2)≈** |" in md
    assert "| all | 64 | 1 | **4.1M** | 61.0 ± 12.7 (med 61.0, n=2) |" in md  # identical params across seeds: no "± 0"
    tex = to_latex(table)
    for rule in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert tex.count(rule) == 1
    assert r"\caption{Embedding size \& sharing. Cells: mean $\pm$ half-width of the 95\% t-interval" in tex
    assert r"$^{\approx}$ within noise of the reference row sharing=all E=64 F=1: Welch's t-test" in tex
    assert r"\textbf{66.0 $\pm$ 12.7 (med 66.0, n=2)$^{\approx}$}" in tex and r"\textbf{4.1M}" in tex
    assert tex.count(r"\textbf") == 4
    assert r"attn & 64 & 2 & -- & -- & -- & -- & 0 \\" in tex


def test_latex_escapes_values():
    spec = ReportSpec.from_mapping({"title": "50% of a_b", "rows": ["x"], "metrics": [{"name": "val/m"}]})
    runs = pd.DataFrame({"run_id": ["r"], "state": ["COMPLETE"], "x": ["a_b&c"], "val/m": [1.0]})
    tex = to_latex(aggregate(runs, spec))
    assert r"a\_b\&c" in tex and r"\caption{50\% of a\_b. One seed: no intervals.}" in tex


def test_csv_round_trips_numbers(runs, spec):
    table = aggregate(runs, spec)
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))  # read with Python's float(): pandas 2.1's is 1 ulp off
    assert list(rows[0])[:4] == ["model.sharing", "model.embed_dim", "model.num_ffn", "n"]
    for col in ("val/mlm_acc.mean", "val/mlm_acc.std", "params.backbone.mean", "val/loss.n"):
        back = [float(row[col]) if row[col] else math.nan for row in rows]
        np.testing.assert_array_equal(back, table.stats[col].to_numpy(dtype=float))


def test_formats():
    m = lambda **kw: MetricSpec(name="val/m", **kw)  # noqa: E731
    assert format_cell(12.04e6, 0.0, 2, m(format="millions")) == "12.0M"
    assert format_cell(0.612, 0.004, 3, m(format="percent"), 0.615) == "61.2 ± 0.4 (med 61.5, n=3)"
    assert format_cell(0.612, 0.004, 1, m(format="percent")) == "61.2"
    assert format_cell(0.612, 0.0, 3, m(format="percent")) == "61.2"  # every seed alike: no interval
    assert format_cell(1.23456, float("nan"), 1, m(digits=2)) == "1.23"
    assert format_cell(1234.6, 0.0, 1, m(format="int")) == "1235"
    assert format_cell(2.5e9, 0.0, 1, m(format="sci")) == "2.50e+09"
    assert format_cell(float("nan"), float("nan"), 0, m()) == "–"
    assert sorted(["l10", "l2", None, 3, 1.5], key=natural_key) == [1.5, 3, "l2", "l10", None]


def test_a_column_of_equal_values_has_no_bold_cell(runs):
    spec = ReportSpec.from_mapping(
        {
            "title": "t",
            "rows": ["model.sharing"],
            "metrics": [
                {"name": "val/num_ffn", "better": "lower"},
                {"name": "val/mlm_acc", "better": "higher"},
            ],
        }
    )
    runs = runs.assign(**{"val/num_ffn": 1.0})
    md = to_markdown(aggregate(runs, spec))
    body = md.splitlines()[2:]
    assert not any("**" in line.split("|")[2] for line in body)  # all equal: none bold
    assert sum("**" in line.split("|")[3] for line in body) == 1  # the best MLM acc still is
