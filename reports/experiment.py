"""``ablate report --experiment NAME [--tag KEY=VALUE ...]``: the ``ablate train`` runs of an MLflow
experiment as a report, in the files a study's report has. One row per run, the earliest started
first: its run id, its name and the config fields that differ between the runs, then every metric it
logged at its last value (Lightning's ``epoch`` and ``lr-*`` left out). ``report.md`` adds the settings
every run shares; ``runs.csv`` has each run's whole flattened config and every metric.
"""

from __future__ import annotations

from pathlib import Path

from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports.build import ReportResult, build_report
from ablate.reports.runs import ExperimentRuns, absent_store, load_experiment
from ablate.reports.spec import Format, MetricSpec, ReportSpec
from ablate.sweeps.engine.tracking import redact

LEFT_OUT = ("epoch", "lr-")
"""Metrics Lightning logs for its own bookkeeping, not shown (``runs.csv`` keeps them)."""

FORMATS: dict[str, Format] = {"params.": "int", "flops_per_token": "int", "model_bytes": "int", "train/tokens": "int"}
"""A metric's format by how its name starts (the others: ``float``)."""


def _format(name: str) -> Format:
    return next((fmt for start, fmt in FORMATS.items() if name.startswith(start)), "float")


def experiment_spec(runs: ExperimentRuns, experiment: str, where: dict[str, str]) -> ReportSpec:
    """The report spec of an experiment's runs: rows by run id in start order, the run name and the
    varying config fields as details (headed by their dotted names), every metric a column."""
    metrics = [m for m in runs.metrics if not m.startswith(LEFT_OUT)]
    if not metrics:
        raise ConfigError(f"--experiment {experiment}: its runs logged no metrics yet")
    details = ("run_name", *runs.varying)
    chosen = "".join(f", {key}={value}" for key, value in where.items())
    return ReportSpec(
        title=f"ablate train runs of experiment {experiment}{chosen}",
        rows=("run_id",),
        metrics=tuple(MetricSpec(name=m, format=_format(m)) for m in metrics),
        row_labels={"run_id": "run", **{d: d for d in details}},
        details=details,
        order={"run_id": tuple(runs.started)},
        reference="none",
    )


def build_experiment_report(experiment: str, where: dict[str, str], tracking_uri: str, out: Path) -> ReportResult:
    """Read the experiment's ``ablate train`` runs with every ``where`` tag or param and write their report
    into ``out`` (:func:`~ablate.reports.build.build_report`).

    Raises:
        ConfigError: no store, or no such runs in it (saying when the experiment holds a study's trials).
        StorageError: the store cannot be read.
    """
    if absent_store(tracking_uri) is not None:
        raise ConfigError(f"--experiment {experiment}: no MLflow store at {redact(tracking_uri)} (no run there yet)")
    runs = load_experiment(tracking_uri, experiment, where)
    if runs.frame.empty:
        chosen = f" with {', '.join(f'{k}={v}' for k, v in where.items())}" if where else ""
        study = f"; it holds {runs.others} runs of a study: ablate report {experiment}" if runs.others else ""
        raise ConfigError(f"--experiment {experiment}: no ablate train runs{chosen} in {redact(tracking_uri)}{study}")
    spec = experiment_spec(runs, experiment, where)
    return build_report(spec, experiment, tracking_uri, out, log_to_parent=False, train_runs=runs)
