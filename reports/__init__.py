"""Paper-style tables and plots regenerated from a study's MLflow runs.

``ReportSpec`` (what to show) -> ``load_runs`` (MLflow -> one flat row per run)
-> ``aggregate`` (mean ± std per configuration) -> Markdown / LaTeX / CSV / PNG,
all driven by ``build_report``.
"""

from reports.build import ReportResult, build_report, render_console
from reports.runs import load_runs
from reports.spec import MetricSpec, PlotSpec, ReportSpec
from reports.tables import Table, aggregate, to_csv, to_latex, to_markdown

__all__ = [
    "MetricSpec",
    "PlotSpec",
    "ReportResult",
    "ReportSpec",
    "Table",
    "aggregate",
    "build_report",
    "load_runs",
    "render_console",
    "to_csv",
    "to_latex",
    "to_markdown",
]
