"""Build a report: the MLflow runs of a study (or an experiment's `ablate train` runs) -> table files, plots,
and artifacts on the parent run."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mlflow import MlflowClient
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table as RichTable

from ablate.lightning_modules.config.errors import ConfigError, StorageError
from ablate.lightning_modules.config.paths import output_folder
from ablate.reports.pareto import study_section
from ablate.reports.plots import draw_plots
from ablate.reports.remeasure import CSV_NAME, REMEASURED_METRICS, RUNTIME, Remeasured, remeasure_runs
from ablate.reports.render import cells, footnotes, to_csv, to_latex, to_markdown
from ablate.reports.runs import ExperimentRuns, absent_store, load_runs, load_stages
from ablate.reports.spec import ReportSpec
from ablate.reports.tables import Expected, Table, aggregate, aggregated_metrics
from ablate.sweeps.engine.tracking import redact

#: Artifact folder on the study's parent run.
ARTIFACT_PATH = "report"
#: Under a table whose latencies are the runs' own (``ablate report --no-remeasure``).
LOGGED_NOTE = (
    "Latency as each run logged it while it trained (--no-remeasure): runs timed minutes apart, on whatever "
    "else the machine ran then, in PyTorch; figures of two rows are comparable only when ablate report times "
    "them again (its default)."
)


@dataclass(frozen=True)
class ReportResult:
    """What :func:`build_report` wrote.

    Attributes:
        markdown, latex, csv: The table files (``report.md``, ``report.tex``, ``report.csv``).
        runs_csv: Every trial run, one row each (``runs.csv``).
        plots: The plot PNGs.
        run_ids: Runs the table averages (included states, sorted).
        missing: One line per empty cell, empty row or skipped plot.
        parent_run_id: The study's parent run, if any.
        logged: Whether the files were logged as artifacts of the parent run.
        table: The aggregated table.
        remeasured: ``remeasured.csv`` when the report timed the models again (``remeasure``), else None.
    """

    markdown: Path
    latex: Path
    csv: Path
    runs_csv: Path
    plots: list[Path]
    run_ids: list[str]
    missing: list[str]
    parent_run_id: str | None
    logged: bool
    table: Table = field(repr=False)
    remeasured: Path | None = None

    @classmethod
    def written(
        cls,
        out_dir: Path,
        table: Table,
        plots: list[Path],
        missing: list[str],
        parent: str | None,
        logged: bool,
        *,
        remeasured: bool,
    ) -> ReportResult:
        """What a report wrote into ``out_dir`` (:data:`NAMES`, ``plots`` by name, ``remeasured.csv``)."""
        return cls(
            markdown=out_dir / NAMES["markdown"],
            latex=out_dir / NAMES["latex"],
            csv=out_dir / NAMES["csv"],
            runs_csv=out_dir / NAMES["runs_csv"],
            plots=[out_dir / p.name for p in plots],
            run_ids=table.run_ids,
            missing=missing,
            parent_run_id=parent,
            logged=logged,
            table=table,
            remeasured=out_dir / CSV_NAME if remeasured else None,
        )

    @property
    def files(self) -> list[Path]:
        """Every file written."""
        extra = [self.remeasured] if self.remeasured is not None else []
        return [self.markdown, self.latex, self.csv, self.runs_csv, *extra, *self.plots]


def markdown_document(
    table: Table, study: str, missing: list[str], settings: Mapping[str, object] | None = None, of: str = "study"
) -> str:
    """The full ``report.md``: title, table, its footnotes, runs used, missing cells; for ``ablate train``
    runs (``of="experiment"``), ``settings``: the config fields every run shares, as a table of their own."""
    spec = table.spec
    parts = [f"# {spec.title}", ""]
    if table.stats.empty:
        parts += [f"No runs found for {of} `{study}`.", ""]
    else:
        parts += [to_markdown(table)]
        if notes := footnotes(table):
            parts += [line for n in notes for line in (n, "")]
    parts.append(f"{of.capitalize()}: `{study}`; states included: {', '.join(spec.include_states)}.")
    parts += ["", f"Runs used ({len(table.run_ids)}): " + (", ".join(f"`{r}`" for r in table.run_ids) or "none"), ""]
    if missing:
        parts += ["Missing:", "", *(f"- {m}" for m in missing), ""]
    else:
        parts += ["Missing: none", ""]
    if settings:
        parts += ["Settings every run shares:", "", "| field | value |", "|---|---|"]
        parts += [*(f"| {key} | {'' if value is None else value} |" for key, value in settings.items()), ""]
    return "\n".join(parts)


def _publish(staging: Path, out_dir: Path) -> None:
    """Move staged files into ``out_dir``: one rename if it is new, else file by file."""
    if not out_dir.exists():
        os.replace(staging, out_dir)
        return
    for f in staging.iterdir():
        os.replace(f, out_dir / f.name)
    staging.rmdir()


def _study_runs(tracking_uri: str, study: str, sweep: str | None) -> tuple[pd.DataFrame, str | None, pd.DataFrame]:
    """A study's trial runs, its parent run and its chained trials' stage runs (ConfigError, naming
    ``sweep``, where the store holds no run of it)."""
    run = f"run: {sweep}" if sweep else "run the study with ablate sweep STUDY.yaml first, or name another with --study"
    if absent_store(tracking_uri) is not None:  # nothing ran here yet: say what makes the runs, create nothing
        raise ConfigError(f"no runs for study {study} in {redact(tracking_uri)} (no MLflow store there yet); {run}")
    runs, parent = load_runs(tracking_uri, study)
    if runs.empty:  # nothing to tabulate: an error, not an empty report
        raise ConfigError(f"no runs for study {study} in {redact(tracking_uri)}; {run}")
    return runs, parent, load_stages(tracking_uri, study, runs["run_id"].to_list())  # chained trials' seeds


def latency_columns(spec: ReportSpec) -> list[str]:
    """The latency metrics (``latency_ms_b1``, ``latency_ms_b32``, ``_all``, their ``_spread``) the table or a plot
    shows."""
    return [m for m in aggregated_metrics(spec) if m in REMEASURED_METRICS]


def _with_latencies(
    table: Table,
    spec: ReportSpec,
    runs: pd.DataFrame,
    again: Remeasured | None,
    expected: Expected | None,
    stages: pd.DataFrame | None,
) -> Table:
    """The table with the latencies timed again (``again``; a column says which runtime timed each row),
    or with the logged ones and a line under it that says so (a report that shows latency)."""
    if again is not None:
        shown = spec
        if RUNTIME not in spec.details:  # which runtime and form timed each row
            labels = {RUNTIME: "timed by", **spec.row_labels}
            shown = dataclasses.replace(spec, details=(*spec.details, RUNTIME), row_labels=labels)
        return dataclasses.replace(aggregate(again.apply(runs), shown, expected, stages), notes=again.notes)
    if latency_columns(spec) and len(runs):
        return dataclasses.replace(table, notes=(*table.notes, LOGGED_NOTE))
    return table


def _report_runs(
    tracking_uri: str, study: str, sweep: str | None, train_runs: ExperimentRuns | None
) -> tuple[pd.DataFrame, str | None, pd.DataFrame | None]:
    """The runs a report tabulates, their parent run and their chained trials' stage runs: ``train_runs``'s
    (no parent, no stages) where given, else the study's (:func:`_study_runs`)."""
    if train_runs is not None:
        return train_runs.frame, None, None
    return _study_runs(tracking_uri, study, sweep)


def _timed_again(
    runs: pd.DataFrame, spec: ReportSpec, tracking_uri: str, remeasure: bool, progress: bool
) -> Remeasured | None:
    """With ``remeasure``, the latencies of the runs the table averages timed again (None without it, or
    without runs); ConfigError where the report shows no latency."""
    if remeasure and not latency_columns(spec):
        raise ConfigError("--remeasure: this report shows no latency (latency_ms_b1, latency_ms_b32)")
    included = runs[runs["state"].isin(spec.include_states)]
    return remeasure_runs(included, tracking_uri, progress=progress) if (remeasure and len(runs)) else None


@contextmanager
def _staging(out_dir: Path) -> Iterator[Path]:
    """A new folder next to ``out_dir`` to write the report into, published into ``out_dir``
    (:func:`_publish`) when the block ends without an error and removed either way: a failure leaves
    ``out_dir`` untouched."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        yield staging
        _publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build_report(
    spec: ReportSpec,
    study: str,
    tracking_uri: str,
    out_dir: Path,
    log_to_parent: bool = True,
    remeasure: bool = False,
    progress: bool = True,
    expected: Expected | None = None,
    sweep: str | None = None,
    train_runs: ExperimentRuns | None = None,
) -> ReportResult:
    """Read the study's runs from MLflow and write the report into ``out_dir``.

    Everything is rendered into a temporary folder next to ``out_dir`` first, so
    a failure leaves ``out_dir`` untouched. Files already in ``out_dir`` with
    other names are kept.

    Args:
        spec: What the table and plots show.
        study: Study name (= MLflow experiment name).
        tracking_uri: MLflow tracking URI.
        out_dir: Output folder (created if needed).
        log_to_parent: Also log the files as artifacts of the study's parent
            run under ``report/`` (when a parent run exists).
        remeasure: Time the deployed model of every run the table averages again, in this process,
            one model after the other in a few rounds (:func:`ablate.reports.remeasure.remeasure_runs`),
            and show those latencies instead of the logged ones, with a column saying which runtime timed
            each row (``ablate report`` does, where the report shows a latency); the table says where, when
            and how, and ``remeasured.csv`` lists them beside the logged ones. False: the logged latencies,
            and a line under the table that says so (:data:`LOGGED_NOTE`).
        progress: With ``remeasure``: show a progress bar (on stderr).
        expected: The trials the study's grid runs per row: a row no trial started is listed
            as missing (:func:`~ablate.reports.tables.aggregate`).
        sweep: The command that runs the study, named when the store holds no run of it.
        train_runs: Instead of a study's trials, these runs of ``ablate train`` (``study``: their
            experiment), read already (:func:`~ablate.reports.runs.load_experiment`); ``report.md``
            adds the settings they share.

    Raises:
        StorageError: the tracking store cannot be read, or the artifacts cannot be logged.
        ConfigError: no run of the study in the store (naming ``sweep``); a row param is not a
            param of any run; ``remeasure`` for a report that shows no latency.
    """
    output_folder(out_dir, "--out")  # before anything is read or written
    runs, parent, stages = _report_runs(tracking_uri, study, sweep, train_runs)
    table = aggregate(runs, spec, expected, stages)  # a bad spec fails here, before any measuring
    again = _timed_again(runs, spec, tracking_uri, remeasure, progress)
    table = _with_latencies(table, spec, runs, again, expected, stages)
    out_dir = Path(out_dir)
    with _staging(out_dir) as staging:
        plots, missing = _write_files(staging, spec, table, runs, again, study, tracking_uri, parent, train_runs)
        logged = _log_artifacts(tracking_uri, parent, staging) if log_to_parent and parent is not None else False
    return ReportResult.written(out_dir, table, plots, missing, parent, logged, remeasured=again is not None)


NAMES = {"markdown": "report.md", "latex": "report.tex", "csv": "report.csv", "runs_csv": "runs.csv"}
"""The files every report writes, by what they hold (``remeasured.csv`` besides, with ``--remeasure``)."""


def _write_files(
    staging: Path,
    spec: ReportSpec,
    table: Table,
    runs: pd.DataFrame,
    again: Remeasured | None,
    study: str,
    tracking_uri: str,
    parent: str | None,
    train_runs: ExperimentRuns | None,
) -> tuple[list[Path], list[str]]:
    """Write the report's files into ``staging`` (:data:`NAMES`, the plots, ``again``'s CSV, the guard's
    section and its plots); return the plots and the lines saying what is missing."""
    plots, skipped = draw_plots(table, staging)
    missing = [m.describe(spec) for m in table.missing] + skipped + (again.missing if again else [])
    if again is not None:
        (staging / CSV_NAME).write_text(again.to_csv(), encoding="utf-8")
    shared, of = (train_runs.shared, "experiment") if train_runs is not None else (None, "study")
    document = markdown_document(table, study, missing, shared, of=of)
    shown = again.apply(runs) if again else runs
    included = shown[shown["state"].isin(spec.include_states)]
    if (guarded := study_section(tracking_uri, parent, included, staging)) is not None:  # optimize.guard
        document += "\n" + guarded.markdown
        plots += [f for f in guarded.files if f.suffix == ".png"]
    (staging / NAMES["markdown"]).write_text(document, encoding="utf-8")
    (staging / NAMES["latex"]).write_text(to_latex(table), encoding="utf-8")
    (staging / NAMES["csv"]).write_text(to_csv(table), encoding="utf-8")
    runs.to_csv(staging / NAMES["runs_csv"], index=False)
    return plots, missing


def _log_artifacts(tracking_uri: str, parent: str, staging: Path) -> bool:
    """The report's files as artifacts of the study's parent run, under ``report/`` (StorageError if not):
    True, logged."""
    try:
        MlflowClient(tracking_uri=tracking_uri).log_artifacts(parent, str(staging), ARTIFACT_PATH)
    except Exception as exc:  # noqa: BLE001 - any failure of the artifact store
        raise StorageError(f"{tracking_uri}: cannot log report artifacts on run {parent} ({exc})") from exc
    return True


def render_console(result: ReportResult, console: Console | None = None) -> None:
    """Print the table, missing cells and output paths to the terminal with rich.

    Piped or logged (not a terminal), the console is as wide as the table, so that no
    header is cut to an ellipsis at rich's default 80 columns."""
    table = result.table
    headers, text, bold = cells(table)
    notes = footnotes(table)
    rt = RichTable(
        title=table.spec.title,
        header_style="bold",
        caption="\n".join(escape(n) for n in notes) or None,
        caption_justify="left",
    )
    n_keys = len(table.spec.rows) + len(table.spec.details)
    for i, h in enumerate(headers):
        rt.add_column(h, justify="left" if i < n_keys else "right")
    for t, b in zip(text, bold, strict=True):
        rt.add_row(*(f"[bold green]{escape(s)}[/]" if bb else escape(s) for s, bb in zip(t, b, strict=True)))
    if console is None:
        console = Console()
        if not console.is_terminal:
            natural = Measurement.get(console, console.options.update_width(10_000), rt).maximum
            console = Console(width=max(console.width, natural))
    console.print(rt)
    for m in result.missing:
        console.print(f"[yellow]missing[/] {m}", highlight=False)
    console.print(f"runs used: {len(result.run_ids)}; wrote {result.markdown.parent}", highlight=False)
