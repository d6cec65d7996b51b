"""Aggregate run rows into a paper-style table and render it as Markdown, LaTeX and CSV."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports import stats as st_
from ablate.reports.rows import (
    Key,
    clean_key,
    clean_value,
    key_column,
    reference_row,
    reference_text,
    row_sort_key,
    row_text,
)
from ablate.reports.seeds import samples as seed_samples
from ablate.reports.spec import MetricSpec, ReportSpec

MISSING = "–"
_KEY = "_row_key"

#: A metric ``m`` whose runs also logged ``m_spread`` (e.g. ``latency_ms_b32_spread``, the relative
#: gap between the median and the fastest of its timed repeats; ``profiling.SPREAD_SUFFIX``) gets
#: :data:`SPREAD_MARK` on every cell where some run's spread exceeds :data:`SPREAD_LIMIT`.
SPREAD_SUFFIX = "_spread"
SPREAD_LIMIT = 0.10
SPREAD_MARK = "†"
SPREAD_NOTE = (
    f"{SPREAD_MARK} spread over {SPREAD_LIMIT * 100:.0f} % between repeats: the machine was busy; "
    "rerun ablate report on a quiet machine (it times every model again)"
)
#: A metric ``m`` whose runs also logged ``m_reference`` (the time of a fixed reference workload run
#: beside its repeats; ``ablate.lightning_modules.measure.reference_load``) gets :data:`REFERENCE_MARK` on
#: every cell where some run's reference took over :data:`REFERENCE_LIMIT` times the fastest
#: reference of the table's runs measured on the same device (param :data:`MEASURED_ON`): the
#: least disturbed one, the machine's baseline as the study saw it (load only ever adds time).
REFERENCE_SUFFIX = "_reference"
REFERENCE_LIMIT = 1.5
REFERENCE_MARK = "‡"
MEASURED_ON = "measure.device"  # ablate.lightning_modules.measure.accounting.MEASURED_ON
REFERENCE_NOTE = (
    f"{REFERENCE_MARK} measured while a fixed reference workload ran over {REFERENCE_LIMIT:g}x slower than beside "
    "the table's quietest run: the machine was busy; rerun ablate report on a quiet machine (it times every "
    "model again)"
)


@dataclass(frozen=True)
class Missing:
    """A table cell (or a whole row, ``metric=None``) with no value."""

    row: Key
    metric: str | None
    reason: str

    def describe(self, spec: ReportSpec) -> str:
        """``sharing=all E=64 / MLM acc: not recorded by its 2 runs``."""
        what = row_text(spec, self.row)
        if self.metric is not None:
            what += f" / {spec.axis_label(self.metric)}"
        return f"{what}: {self.reason}"


@dataclass(frozen=True)
class Expected:
    """The trials a study's grid runs, per table row: what an empty row is missing.

    Attributes:
        trials: Row key (as :func:`clean_key` makes it) -> trials of the grid with that key.
        command: The command that runs the missing trials (``ablate sweep STUDY.yaml``), if known.
    """

    trials: Mapping[Key, int]
    command: str | None = None


@dataclass(frozen=True)
class Table:
    """Aggregated statistics, one row per distinct value of ``spec.rows``.

    Attributes:
        spec: The report spec.
        stats: Columns: each of ``spec.rows`` (dotted names), ``n`` (included runs),
            then ``<metric>.mean``, ``.std`` (NaN unless n > 1), ``.n`` (samples: seeds),
            ``.median``, ``.half_width``, ``.ci_low``, ``.ci_high`` (the 95% t-interval, NaN
            unless n > 1), ``.welch_p`` and ``.within_noise`` (against the reference row;
            :mod:`ablate.reports.stats`) for every spec metric and every plot axis that is a
            metric (each name a plot with ``over`` takes), and
            ``<metric>.spread`` (the largest ``<metric>_spread`` of the row's runs) for
            every spec metric whose runs logged one, and ``<metric>.reference`` (the largest
            ratio of a run's ``<metric>_reference`` to the fastest of the included runs' on
            the same device) for every spec metric whose runs logged one. Naturally sorted.
        run_ids: Ids of the included runs that the table averages.
        missing: Empty cells and rows, in table order.
        notes: Lines printed under the table (e.g. where ``--remeasure`` measured).
        reference: Position of the reference row (``spec.reference``), None without one.
        samples: The values each cell's statistics are over (:data:`ablate.reports.seeds.SAMPLE_COLUMNS`,
            ``row`` the row's position).
    """

    spec: ReportSpec
    stats: pd.DataFrame
    run_ids: list[str]
    missing: list[Missing]
    notes: tuple[str, ...] = ()
    reference: int | None = None
    samples: pd.DataFrame | None = None

    def keys(self) -> list[Key]:
        """Row keys in table order."""
        return [tuple(clean_value(v) for v in r) for r in self.stats[list(self.spec.rows)].itertuples(index=False)]


def aggregated_metrics(spec: ReportSpec) -> list[str]:
    """Spec metrics, then plot axes that are metrics (not row params): for a plot with ``over``,
    every name its ``x`` and ``y`` take (``sst2/speed_0.1/accuracy``, ...)."""
    names = [m.name for m in spec.metrics]
    for _, name in _metric_keys(spec):
        if name not in names:
            names.append(name)
    return names


def _metric_keys(spec: ReportSpec) -> list[tuple[str, str]]:
    """(dotted spec key, name) of every metric the table or a plot needs."""
    keys = [(f"metrics[{i}].name", m.name) for i, m in enumerate(spec.metrics)]
    for i, p in enumerate(spec.plots):
        for axis in ("x", "y"):
            keys += [(f"plots[{i}].{axis}", name) for name in p.names(axis) if name not in spec.rows]
    return keys


def aggregate(
    runs: pd.DataFrame, spec: ReportSpec, expected: Expected | None = None, stages: pd.DataFrame | None = None
) -> Table:
    """Group runs by ``spec.rows`` and take each metric's statistics over the included runs' seeds
    (:mod:`ablate.reports.stats`; with ``stages``, the study's fine-tuning stage runs, a chained
    trial's per-seed values of its ``<task>/...`` metrics: :mod:`ablate.reports.seeds`).

    Every configuration seen in ``runs`` gets a row, even one whose runs all
    failed or were pruned (its cells are then missing); with ``expected`` (the study's
    grid), so does every configuration of the grid no trial started, and a row with fewer
    runs than the grid has trials says so. ``expected`` is ignored if a run's configuration
    is not in it (the runs are not that grid's).

    Raises:
        ConfigError: a row param is not a param of any run; ``reference`` matches several rows.
    """
    metrics = aggregated_metrics(spec)
    columns = [*spec.rows, "n"] + [f"{m}.{s}" for m in metrics for s in st_.STATS]
    if runs.empty:
        return Table(spec, pd.DataFrame(columns=columns), [], [])
    runs = _keyed(runs, spec, metrics)
    if expected is not None and not set(runs[_KEY]) <= set(expected.trials):
        expected = None
    grid = set(expected.trials) if expected is not None else set()
    keys = sorted(
        set(runs[_KEY]) | grid,
        key=lambda k: tuple(row_sort_key(spec, row, v) for row, v in zip(spec.rows, k, strict=True)),
    )
    used = runs[runs["state"].isin(spec.include_states)]

    n = used.groupby(_KEY, sort=False).size().reindex(keys, fill_value=0)
    position = {k: i for i, k in enumerate(keys)}
    samples = seed_samples(used, used[_KEY].map(position), metrics, stages)
    ref_row = reference_row(spec, keys, n.to_list())
    stats = pd.DataFrame({r: key_column([k[i] for k in keys]) for i, r in enumerate(spec.rows)})
    stats["n"] = n.to_numpy()
    summary = st_.summarize(samples, len(keys), metrics)
    tested = st_.noise(samples, len(keys), metrics, ref_row)
    stats = pd.concat([stats, summary, tested, _beside(used, spec, keys)], axis=1)
    missing = _missing(runs, spec, keys, stats, expected)
    return Table(spec, stats, sorted(used["run_id"]), missing, reference=ref_row, samples=samples)


def _keyed(runs: pd.DataFrame, spec: ReportSpec, metrics: list[str]) -> pd.DataFrame:
    """``runs`` with a column for every metric (empty where no run logged it) and each run's row key.
    ConfigError: a row param no run has, a metric that is not numeric."""
    for i, r in enumerate(spec.rows):
        if r not in runs.columns:
            raise ConfigError(f"report.rows[{i}]: {r!r} is not a param of any run in this study")
    runs = runs.reindex(columns=[*runs.columns, *(m for m in metrics if m not in runs.columns)])
    for field, name in _metric_keys(spec):
        if not pd.api.types.is_numeric_dtype(runs[name]):
            raise ConfigError(f"report.{field}: {name!r} is not numeric in this study's runs")
    return runs.assign(**{_KEY: [clean_key(t) for t in runs[list(spec.rows)].itertuples(index=False)]})


def _beside(used: pd.DataFrame, spec: ReportSpec, keys: list[Key]) -> pd.DataFrame:
    """Per row: how much the repeats behind a measured figure disagreed (``<metric>.spread``), how slow
    the machine was meanwhile (``<metric>.reference``), and each detail's distinct values (text)."""
    by_row = used.groupby(_KEY, sort=False)
    out = pd.DataFrame(index=range(len(keys)))
    for metric in spec.metrics:
        spread = metric.name + SPREAD_SUFFIX
        if spread in used.columns and metric.name != spread:
            values = pd.to_numeric(used[spread], errors="coerce")
            out[f"{metric.name}.spread"] = values.groupby(used[_KEY], sort=False).max().reindex(keys).to_numpy(float)
        reference = metric.name + REFERENCE_SUFFIX
        if reference in used.columns and metric.name != reference:
            worst = _reference_ratio(used, reference).groupby(used[_KEY], sort=False).max()
            out[f"{metric.name}.reference"] = worst.reindex(keys).to_numpy(float)
    for d in spec.details:  # text beside the keys: the distinct values of the included runs
        if d in used.columns:
            joined = by_row[d].agg(lambda v: " / ".join(sorted({str(x) for x in v.dropna()})))
            out[d] = joined.reindex(keys).fillna("").to_numpy()
        else:
            out[d] = [""] * len(keys)
    return out


def _missing(
    runs: pd.DataFrame, spec: ReportSpec, keys: list[Key], stats: pd.DataFrame, expected: Expected | None
) -> list[Missing]:
    """The table's empty rows and cells, in table order, each with why."""
    missing: list[Missing] = []
    states = runs.groupby(_KEY, sort=False)["state"].agg(lambda s: s.fillna("no state").value_counts().to_dict())
    seen_states = dict(zip(states.index, states.to_list(), strict=True))
    wanted = "/".join(spec.include_states)
    for i, key in enumerate(keys):
        n_runs = int(stats.at[i, "n"])
        if expected is not None and (short := _never_started(key, seen_states.get(key, {}), expected)):
            missing.append(Missing(key, None, short))
            if key not in seen_states:
                continue
        if n_runs == 0:
            seen = ", ".join(f"{c} {s}" for s, c in seen_states[key].items())
            missing.append(Missing(key, None, f"no {wanted} runs ({seen})"))
            continue
        for metric in spec.metrics:
            if stats.at[i, f"{metric.name}.n"] == 0 and not metric.optional:
                missing.append(Missing(key, metric.name, f"not recorded by its {n_runs} {wanted} run(s)"))
    return missing


def _reference_ratio(used: pd.DataFrame, column: str) -> pd.Series:
    """Each run's reference time over the fastest of the runs' measured on the same device."""
    values = pd.to_numeric(used[column], errors="coerce")
    device = used[MEASURED_ON].fillna("").astype(str) if MEASURED_ON in used.columns else pd.Series("", used.index)
    return values / values.groupby(device).transform("min")


def _never_started(key: Key, states: Mapping[str, int], expected: Expected) -> str | None:
    """Why a row of the grid lacks trials (none, or fewer than the grid has), or None."""
    want, have = expected.trials.get(key, 0), sum(states.values())
    if have >= want:
        return None
    run = f"; run: {expected.command}" if expected.command else ""
    if not have:
        return f"never started: no run of its {want} trial{'s' * (want != 1)}{run}"
    return f"{want - have} of its {want} trials never started ({have} run{'s' * (have != 1)}){run}"


# ---------------------------------------------------------------- formatting
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
