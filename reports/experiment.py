"""``ablate report experiment NAME [--tag KEY=VALUE ...]``: the ``ablate train`` runs of an MLflow
experiment as a report, in the files a study's report has, one row per run (runs that differ only in
``seed``: one row, with intervals over the seeds); docs/reports.md, "Runs of ablate train"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

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


SEED = "seed"
SEEDS_ROW = "runs"
"""The row key of runs that differ only in their seed: their run ids, shortened, in start order."""


def seed_groups(runs: ExperimentRuns) -> ExperimentRuns | None:
    """``runs`` with a :data:`SEEDS_ROW` column that puts the runs differing only in ``seed`` in one row
    (one row per other setting; its samples: one per seed); None when no two runs differ only so."""
    if SEED not in runs.varying:
        return None
    others = [p for p in runs.varying if p != SEED]
    frame = runs.frame.copy()
    keys = frame[others].astype(str).agg(" | ".join, axis=1) if others else pd.Series("", index=frame.index)
    if keys.value_counts().max() < 2:
        return None
    labels = frame["run_id"].groupby(keys, sort=False).agg(lambda ids: ", ".join(i[:8] for i in ids))
    frame[SEEDS_ROW] = keys.map(labels)
    return dataclasses.replace(runs, frame=frame)


def experiment_spec(runs: ExperimentRuns, experiment: str, where: dict[str, str], by_seed: bool) -> ReportSpec:
    """The report spec of an experiment's runs: rows by run id in start order (``by_seed``: runs that differ
    only in their seed in one row, with intervals over the seeds), the run name and the varying config
    fields as details (headed by their dotted names), every metric a column."""
    metrics = [m for m in runs.metrics if not m.startswith(LEFT_OUT)]
    if not metrics:
        raise ConfigError(f"--experiment {experiment}: its runs logged no metrics yet")
    details = ("run_name", *runs.varying)
    chosen = "".join(f", {key}={value}" for key, value in where.items())
    row = SEEDS_ROW if by_seed else "run_id"
    order = tuple(runs.frame[row].drop_duplicates()) if by_seed else tuple(runs.started)
    return ReportSpec(
        title=f"ablate train runs of experiment {experiment}{chosen}" + (", seeds in one row" if by_seed else ""),
        rows=(row,),
        metrics=tuple(MetricSpec(name=m, format=_format(m)) for m in metrics),
        row_labels={row: "run ids" if by_seed else "run", **{d: d for d in details}},
        details=details,
        order={row: order},
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
        held = f"; it holds {runs.others} runs of study {experiment}: ablate report STUDY.yaml (its file)"
        study = held if runs.others else ""
        raise ConfigError(f"--experiment {experiment}: no ablate train runs{chosen} in {redact(tracking_uri)}{study}")
    grouped = seed_groups(runs)
    spec = experiment_spec(grouped or runs, experiment, where, by_seed=grouped is not None)
    return build_report(spec, experiment, tracking_uri, out, log_to_parent=False, train_runs=grouped or runs)
