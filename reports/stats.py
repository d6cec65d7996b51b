"""What a report cell says about its seeds (:mod:`ablate.reports.seeds`): the mean and a 95% t-interval
over them, the median, and whether the cell is within noise of the table's reference row by Welch's
t-test (docs/reports.md, "Seeds and confidence")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

#: Confidence of a cell's interval, and the level of the noise test.
CONFIDENCE = 0.95
ALPHA = 0.05
#: After a cell within noise of the reference row's.
NOISE_MARK = "≈"
TEST_NAME = "Welch's t-test over seeds (scipy.stats.ttest_ind, equal_var=False)"
INTERVAL_NOTE = (
    f"Cells: mean ± half-width of the {CONFIDENCE:.0%} t-interval over the cell's n seeds (scipy.stats.t), "
    "median as med; a cell without ± has one seed, or seeds that all gave the same figure"
)
ONE_SEED_NOTE = "one seed: no intervals"

#: The statistics :func:`summarize` adds per metric, as ``<metric>.<stat>`` columns.
STATS = ("mean", "std", "n", "median", "half_width", "ci_low", "ci_high")


def half_width(std: float, n: int) -> float:
    """Half the width of the two-sided :data:`CONFIDENCE` t-interval of a mean over ``n`` values
    whose sample standard deviation is ``std``; NaN for n < 2."""
    if n < 2 or math.isnan(std):
        return math.nan
    return float(sps.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * std / math.sqrt(n))


def summarize(samples: pd.DataFrame, rows: int, metrics: Sequence[str]) -> pd.DataFrame:
    """Per table row (``0 .. rows - 1``) and metric: :data:`STATS` over the row's samples.

    Args:
        samples: Columns ``row`` (the table row's position), ``metric`` and ``value``.
        rows: How many rows the table has (rows without samples get n = 0 and NaN).
        metrics: The metric names, in column order.

    Returns:
        A frame indexed by row position with columns ``<metric>.<stat>``.
    """
    grouped = samples.groupby(["row", "metric"])["value"]
    agg = grouped.agg(["mean", "std", "count", "median"])
    out: dict[str, np.ndarray] = {}
    for m in metrics:
        part = agg.xs(m, level="metric") if m in agg.index.get_level_values("metric") else agg.iloc[0:0]
        part = part.droplevel("metric") if isinstance(part.index, pd.MultiIndex) else part
        part = part.reindex(range(rows))
        n = part["count"].fillna(0).to_numpy(dtype=int)
        mean, std = part["mean"].to_numpy(dtype=float), part["std"].to_numpy(dtype=float)
        half = np.array([half_width(s, k) for s, k in zip(std, n, strict=True)], dtype=float)
        out |= {
            f"{m}.mean": mean,
            f"{m}.std": std,
            f"{m}.n": n,
            f"{m}.median": part["median"].to_numpy(dtype=float),
            f"{m}.half_width": half,
            f"{m}.ci_low": mean - half,
            f"{m}.ci_high": mean + half,
        }
    return pd.DataFrame(out, index=pd.RangeIndex(rows))


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sided p-value of Welch's t-test between two cells' samples; NaN when either has
    fewer than two or neither has any spread (the test says nothing there)."""
    if len(a) < 2 or len(b) < 2 or (np.std(a) == 0 and np.std(b) == 0):
        return math.nan
    return float(sps.ttest_ind(a, b, equal_var=False).pvalue)


def noise(samples: pd.DataFrame, rows: int, metrics: Sequence[str], reference: int | None) -> pd.DataFrame:
    """Per row and metric: ``<metric>.welch_p`` (:func:`welch_p` against row ``reference``; NaN
    in the reference row, untested cells and without a reference) and ``<metric>.within_noise``
    (p >= :data:`ALPHA`)."""
    values = samples.groupby(["row", "metric"])["value"].agg(list).to_dict()
    out: dict[str, list[float] | list[bool]] = {}
    for m in metrics:
        ref = values.get((reference, m), []) if reference is not None else []
        p = [math.nan if i == reference else welch_p(values.get((i, m), []), ref) for i in range(rows)]
        out[f"{m}.welch_p"] = p
        out[f"{m}.within_noise"] = [not math.isnan(v) and v >= ALPHA for v in p]
    return pd.DataFrame(out, index=pd.RangeIndex(rows))


def noise_note(reference: str | None, asked: str, marked: bool) -> str:
    """The footnote naming the test and the reference row: ``reference`` its text, None when the
    table has no row with runs that ``asked`` (the spec's words for it) names."""
    if reference is None:
        return f"{NOISE_MARK}: the reference row ({asked}) has no runs in this table: no cell is tested against it"
    found = "" if marked else "; no cell here is"
    return f"{NOISE_MARK} within noise of the reference row {reference}: {TEST_NAME}, p >= {ALPHA:g}{found}"
