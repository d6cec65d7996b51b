"""Paper-style tables and plots regenerated from a study's MLflow runs: ``ReportSpec`` -> ``load_runs``
-> ``aggregate`` (mean, 95% t-interval, median, Welch's test) -> Markdown / LaTeX / CSV / PNG, all
driven by ``build_report``; shipped specs in ``reports/specs/``. Submodules are imported on first use,
so reading a spec does not load matplotlib (docs/reports.md)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MetricSpec": "ablate.reports.spec",
    "PlotSpec": "ablate.reports.spec",
    "ReportSpec": "ablate.reports.spec",
    "ReportResult": "ablate.reports.build",
    "build_report": "ablate.reports.build",
    "render_console": "ablate.reports.build",
    "load_runs": "ablate.reports.runs",
    "Table": "ablate.reports.tables",
    "aggregate": "ablate.reports.tables",
    "to_csv": "ablate.reports.render",
    "to_latex": "ablate.reports.render",
    "to_markdown": "ablate.reports.render",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'reports' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
