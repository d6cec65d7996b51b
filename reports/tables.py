"""Aggregate run rows into a paper-style table and render it as Markdown, LaTeX and CSV."""

from __future__ import annotations

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
    row_sort_key,
    row_text,
)
from ablate.reports.seeds import samples as seed_samples
from ablate.reports.spec import ReportSpec

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
