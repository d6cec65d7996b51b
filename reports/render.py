"""A report table rendered: its cells (mean and 95% interval, marks for noisy or busy measurements and
cells within noise of the reference row) as Markdown, LaTeX and CSV, and the notes under it."""

from __future__ import annotations

import math

import pandas as pd

from ablate.reports import stats as st_
from ablate.reports.rows import reference_text, row_text
from ablate.reports.spec import MetricSpec
from ablate.reports.tables import (
    MISSING,
    REFERENCE_LIMIT,
    REFERENCE_MARK,
    REFERENCE_NOTE,
    SPREAD_LIMIT,
    SPREAD_MARK,
    SPREAD_NOTE,
    Table,
)


def format_number(value: float, metric: MetricSpec) -> str:
    """One number in the metric's format: ``12.0M``, ``61.2`` (percent), ``1.23e+09``."""
    d = metric.ndigits
    if metric.format == "millions":
        return f"{value / 1e6:.{d}f}M"
    if metric.format == "percent":
        return f"{value * 100:.{d}f}"
    if metric.format == "sci":
        return f"{value:.{d}e}"
    return f"{value:.{d}f}"


def format_cell(mean: float, half: float, n: int, metric: MetricSpec, median: float = math.nan) -> str:
    """``61.2 ± 0.9 (med 61.0, n=3)``: the mean, the half-width of its interval, the median and
    the number of seeds, when n > 1 and the seeds differ; else the mean alone; ``–`` when n = 0."""
    if n == 0 or math.isnan(mean):
        return MISSING
    text = format_number(mean, metric)
    if n > 1 and not math.isnan(half) and half > 0:
        med = format_number(mean if math.isnan(median) else median, metric)
        text += f" ± {format_number(half, metric)} (med {med}, n={n})"
    return text


def too_spread(row: pd.Series, metric: MetricSpec) -> bool:
    """Whether a row's cell for ``metric`` comes from runs whose repeats disagreed by more than
    :data:`SPREAD_LIMIT` (its runs logged ``<metric>_spread``; a run without one never counts)."""
    spread = row.get(f"{metric.name}.spread")
    return spread is not None and not math.isnan(spread) and spread > SPREAD_LIMIT and int(row[f"{metric.name}.n"]) > 0


def too_slow(row: pd.Series, metric: MetricSpec) -> bool:
    """Whether a row's cell for ``metric`` comes from a run whose reference workload ran over
    :data:`REFERENCE_LIMIT` times slower than the fastest of the table's runs (a run without a
    ``<metric>_reference`` never counts)."""
    ratio = row.get(f"{metric.name}.reference")
    return ratio is not None and not math.isnan(ratio) and ratio > REFERENCE_LIMIT and int(row[f"{metric.name}.n"]) > 0


def within_noise(row: pd.Series, metric: MetricSpec) -> bool:
    """Whether a row's cell for ``metric`` is within noise of the reference row's
    (:func:`ablate.reports.stats.noise`)."""
    return bool(row.get(f"{metric.name}.within_noise", False))


def marks(row: pd.Series, metric: MetricSpec) -> str:
    """The marks after a cell: :data:`ablate.reports.stats.NOISE_MARK` (:func:`within_noise`),
    :data:`SPREAD_MARK` (:func:`too_spread`), :data:`REFERENCE_MARK` (:func:`too_slow`)."""
    noise = st_.NOISE_MARK if within_noise(row, metric) else ""
    return noise + (SPREAD_MARK if too_spread(row, metric) else "") + (REFERENCE_MARK if too_slow(row, metric) else "")


def seed_notes(table: Table, found: str) -> list[str]:
    """What the cells show: the interval's note, or :data:`ablate.reports.stats.ONE_SEED_NOTE`
    when no cell has two seeds; the noise test's note where a cell was tested against the reference
    row, or the spec's reference row has no runs."""
    ns = [int(v) for m in table.spec.metrics for v in table.stats[f"{m.name}.n"]]
    if not ns or max(ns) == 0:
        return []
    if max(ns) == 1:
        return [st_.ONE_SEED_NOTE]
    notes = [st_.INTERVAL_NOTE]
    tested = any(table.stats[f"{m.name}.welch_p"].notna().any() for m in table.spec.metrics)
    if table.reference is None and table.spec.reference != "none":
        notes.append(st_.noise_note(None, reference_text(table.spec), False))
    elif table.reference is not None and tested:
        ref = row_text(table.spec, table.keys()[table.reference])
        notes.append(st_.noise_note(ref, reference_text(table.spec), st_.NOISE_MARK in found))
    return notes


def footnotes(table: Table) -> list[str]:
    """Lines under the table: its ``notes``, :func:`seed_notes`, then :data:`SPREAD_NOTE` and
    :data:`REFERENCE_NOTE` when a cell has that mark."""
    found = "".join(marks(row, m) for _, row in table.stats.iterrows() for m in table.spec.metrics)
    return [*table.notes, *seed_notes(table, found), *([SPREAD_NOTE] if SPREAD_MARK in found else [])] + (
        [REFERENCE_NOTE] if REFERENCE_MARK in found else []
    )


def cells(table: Table) -> tuple[list[str], list[list[str]], list[list[bool]]]:
    """Headers, display text and bold flags for every cell (key columns, metrics, n).

    The best mean per metric (by ``better``) is bold, along with any mean that
    displays identically; a column whose cells all display alike has no best, so
    nothing in it is bold. A cell within noise of the reference row's ends in ``≈``, one whose
    repeats disagreed (:func:`too_spread`) in :data:`SPREAD_MARK`, one measured on a busy machine
    (:func:`too_slow`) in :data:`REFERENCE_MARK` (:func:`marks`). The last column, ``runs``, counts
    the row's included runs.
    """
    spec, st = table.spec, table.stats
    headers = [spec.row_label(r) for r in (*spec.rows, *spec.details)] + [m.display for m in spec.metrics] + ["runs"]
    best: dict[str, str] = {}
    for m in spec.metrics:
        means = st.loc[st[f"{m.name}.n"] > 0, f"{m.name}.mean"].dropna()
        if m.better and len({format_number(v, m) for v in means}) > 1:
            best[m.name] = format_number(means.max() if m.better == "higher" else means.min(), m)
    text, bold = [], []
    for key, (_, row) in zip(table.keys(), st.iterrows(), strict=True):
        t = [str(v) for v in key] + [str(row[d]) for d in spec.details]
        b = [False] * (len(key) + len(spec.details))
        for m in spec.metrics:
            mean, half, n = row[f"{m.name}.mean"], row[f"{m.name}.half_width"], int(row[f"{m.name}.n"])
            t.append(format_cell(mean, half, n, m, row[f"{m.name}.median"]) + marks(row, m))
            b.append(n > 0 and best.get(m.name) == format_number(mean, m))
        t.append(str(int(row["n"])))
        b.append(False)
        text.append(t)
        bold.append(b)
    return headers, text, bold


def _numeric_columns(table: Table) -> list[bool]:
    keys = [all(isinstance(k, (int, float)) or k is None for k in table.stats[r]) for r in table.spec.rows]
    return keys + [False] * len(table.spec.details) + [True] * (len(table.spec.metrics) + 1)


def to_markdown(table: Table) -> str:
    """A GitHub pipe table; best cells in ``**bold**``."""
    headers, text, bold = cells(table)

    def esc(s: str) -> str:
        return s.replace("|", r"\|")

    lines = ["| " + " | ".join(esc(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---:" if num else ":---" for num in _numeric_columns(table)) + "|")
    for t, b in zip(text, bold, strict=True):
        lines.append("| " + " | ".join(f"**{esc(s)}**" if bb else esc(s) for s, bb in zip(t, b, strict=True)) + " |")
    return "\n".join(lines) + "\n"


_LATEX_SPECIALS = {c: "\\" + c for c in "&%$#_{}"} | {
    "\\": r"\textbackslash{}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(s: str) -> str:
    """Escape LaTeX specials in free text (the caption)."""
    return "".join(_LATEX_SPECIALS.get(c, c) for c in s)


def _latex_marks(s: str) -> str:
    s = s.replace(st_.NOISE_MARK, r"$^{\approx}$").replace("±", r"$\pm$")
    return s.replace(SPREAD_MARK, r"$^\dagger$").replace(REFERENCE_MARK, r"$^\ddagger$")


def to_latex(table: Table) -> str:
    """A booktabs ``table`` with the title (and :func:`footnotes`) as caption; best cells in ``\\textbf{}``."""
    headers, text, bold = cells(table)
    display = pd.DataFrame(text, columns=pd.Index(headers))
    flags = pd.DataFrame(bold, columns=display.columns, index=display.index)
    styler = (
        display.style.hide(axis="index")
        .format(lambda s: _latex_marks(s.replace(MISSING, "--")), escape="latex")
        .format_index(escape="latex", axis=1)
        .apply(lambda _: flags.map(lambda f: "textbf:--rwrap;" if f else ""), axis=None)
    )
    colfmt = "".join("r" if num else "l" for num in _numeric_columns(table))
    caption = latex_escape(table.spec.title)
    if notes := footnotes(table):  # "Title. Latency re-measured on .... $^\dagger$ spread over 10 \% ..."
        joined = " ".join(f"{n[:1].upper()}{n[1:].rstrip('.')}." for n in notes)
        caption = f"{caption.rstrip('.')}. " + _latex_marks(latex_escape(joined).replace("--", "-{}-"))
    latex: str = styler.to_latex(hrules=True, column_format=colfmt, caption=caption, position_float="centering")
    return latex


#: A metric's columns in ``report.csv``, in order (``spread`` and ``reference`` where its runs logged them).
CSV_STATS = (*st_.STATS, "welch_p", "within_noise", "spread", "reference")


def to_csv(table: Table) -> str:
    """Raw numbers: row keys, ``n`` (included runs), and per spec metric ``<metric>.`` +
    :data:`CSV_STATS`: mean, std, n (seeds), median, the 95% t-interval (half-width, low, high),
    Welch's p against the reference row and whether the cell is within noise of it."""
    cols = [*table.spec.rows, *table.spec.details, "n"] + [
        f"{m.name}.{s}" for m in table.spec.metrics for s in CSV_STATS
    ]
    cols = [c for c in cols if not c.endswith((".spread", ".reference")) or c in table.stats.columns]
    csv: str = table.stats[cols].to_csv(index=False)
    return csv
