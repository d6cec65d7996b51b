"""A report cell's samples, the values its statistics are taken over, one per seed: a trial run per
study seed, or, for a chained study's task metrics, a fine-tuning stage run per task seed (pooled over
a row's trials), and the trial metrics that combine tasks recomputed per seed by :data:`ACROSS_TASKS`
(docs/reports.md, "Seeds and confidence")."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from ablate.lightning_modules.config.glue import BERT_AVERAGE, GLUE, LEADERBOARD, Convention
from ablate.lightning_modules.config.metric_names import DOWNSTREAM_AVG, NAMESPACES

#: Columns of a samples frame.
SAMPLE_COLUMNS = ["row", "run_id", "seed", "metric", "value"]

Formula = Callable[[pd.DataFrame], float | None]


def task_metric(name: str) -> bool:
    """Whether a fine-tuning stage's metric is one its trial carries the mean of: a fine-tuning
    task's (``<task>/...``, ``mnli-mm/accuracy``: a namespace that is not one of the registry's)."""
    namespace, slash, rest = name.partition("/")
    return bool(slash and namespace and rest) and namespace not in NAMESPACES


def _mean_of(names: Callable[[str, str], str | None]) -> Formula:
    """A formula: the mean over one seed's stage runs (one per task) of the metric ``names(task,
    finetune.metric)`` names (None: the task does not count); None if a counted one is missing."""

    def formula(stages: pd.DataFrame) -> float | None:
        picked = [names(t, m) for t, m in zip(stages["task"], stages["task_metric"], strict=True)]
        values = [stages[n].iloc[i] if n in stages else math.nan for i, n in enumerate(picked) if n is not None]
        if not values or any(pd.isna(v) for v in values):
            return None
        return float(sum(values) / len(values))

    return formula


def _glue(convention: Convention, wnli: bool) -> Formula:
    """A formula: ``convention``'s GLUE average of one seed's stage runs (one per task, named as GLUE's)."""

    def formula(stages: pd.DataFrame) -> float | None:
        devs = {t: tuple(d.name for d in GLUE[t].dev_sets) for t in stages["task"] if t in GLUE}
        best = {
            column: float(stages[column].iloc[i])
            for i, task in enumerate(stages["task"])
            for dev in devs.get(task, ())
            for column in stages.columns
            if column.startswith(f"{dev}/") and not pd.isna(stages[column].iloc[i])
        }
        return convention.average(best, devs, wnli)

    return formula


#: A chained trial's metrics that combine its tasks, and the formulas that may have made one
#: seed's value from that seed's stage runs (a frame, one row per task): the first whose mean over
#: the seeds is the trial's logged figure is used (none: the trial's figure stands alone).
ACROSS_TASKS: dict[str, tuple[Formula, ...]] = {
    DOWNSTREAM_AVG: (_mean_of(lambda task, metric: f"{task}/best_{metric}"),),
    LEADERBOARD.metric: (_glue(LEADERBOARD, wnli=False), _glue(LEADERBOARD, wnli=True)),  # WNLI out or in
    BERT_AVERAGE.metric: (_glue(BERT_AVERAGE, wnli=False),),
}


def _across_tasks(trial: pd.DataFrame, metric: str, logged: float | None) -> list[tuple[object, float]]:
    """(seed, value) of ``metric`` per seed every task of the trial ran, by the first formula of
    :data:`ACROSS_TASKS` that gives back ``logged`` as their mean; [] when none does."""
    seeds = [frozenset(s.dropna()) for _, s in trial.groupby("task")["seed"]]
    common = sorted(frozenset.intersection(*seeds)) if seeds else []
    if len(common) < 2 or logged is None or math.isnan(logged):  # one seed: the trial's own figure
        return []
    for formula in ACROSS_TASKS[metric]:
        values = [formula(trial[trial["seed"] == s]) for s in common]
        if all(v is not None for v in values):
            found = [(s, float(v)) for s, v in zip(common, values, strict=True) if v is not None]
            if math.isclose(sum(v for _, v in found) / len(found), logged, rel_tol=1e-6, abs_tol=1e-9):
                return found
    return []


def stage_samples(
    stages: pd.DataFrame, metrics: Sequence[str], logged: Mapping[tuple[str, str], float]
) -> pd.DataFrame:
    """Per trial run, metric and seed, the value its fine-tuning stage runs give: each
    :func:`task_metric` from the stage run that logged it, each :data:`ACROSS_TASKS` metric from the
    seeds every task of the trial ran (``logged``: (trial run id, metric) -> the trial's figure).
    Columns ``run_id``, ``seed``, ``metric``, ``value``."""
    rows: list[dict[str, object]] = []
    for m in metrics:
        if task_metric(m) and m in stages:
            own = stages[stages[m].notna()]
            rows += [
                {"run_id": r, "seed": s, "metric": m, "value": v}
                for r, s, v in zip(own["run_id"], own["seed"], own[m], strict=True)
            ]
        elif m in ACROSS_TASKS:
            for run_id, trial in stages.groupby("run_id", sort=False):
                found = _across_tasks(trial, m, logged.get((str(run_id), m)))
                rows += [{"run_id": run_id, "seed": s, "metric": m, "value": v} for s, v in found]
    return pd.DataFrame(rows, columns=["run_id", "seed", "metric", "value"])


def samples(used: pd.DataFrame, row: pd.Series, metrics: Sequence[str], stages: pd.DataFrame | None) -> pd.DataFrame:
    """Every sample of every cell (:data:`SAMPLE_COLUMNS`): a trial's per-seed stage values where
    it has them (:func:`stage_samples`), else its own value.

    Args:
        used: The included trial runs (``run_id``, ``seed`` if logged, and the metric columns).
        row: Each included run's table row position, indexed like ``used``.
        metrics: The metric names.
        stages: The study's fine-tuning stage runs (:func:`ablate.reports.runs.load_stages`), or None.
    """
    seed = used["seed"] if "seed" in used.columns else pd.Series(None, index=used.index, dtype=object)
    own = pd.DataFrame({"row": row, "run_id": used["run_id"], "seed": seed})
    own = pd.concat([own, used[list(metrics)]], axis=1).melt(
        id_vars=["row", "run_id", "seed"], value_vars=list(metrics), var_name="metric", value_name="value"
    )
    own["value"] = pd.to_numeric(own["value"], errors="coerce")
    own = own.dropna(subset=["value"])
    per_seed = pd.DataFrame(columns=["run_id", "seed", "metric", "value"])
    if stages is not None and not stages.empty:
        logged = {(str(r), m): float(v) for r, m, v in zip(own["run_id"], own["metric"], own["value"], strict=True)}
        per_seed = stage_samples(stages[stages["run_id"].isin(set(used["run_id"]))], metrics, logged)
    if per_seed.empty:
        return own[SAMPLE_COLUMNS].reset_index(drop=True)
    covered = set(zip(per_seed["run_id"], per_seed["metric"], strict=True))
    own = own[[(r, m) not in covered for r, m in zip(own["run_id"], own["metric"], strict=True)]]
    per_seed = per_seed.assign(row=per_seed["run_id"].map(dict(zip(used["run_id"], row, strict=True))))
    both = pd.concat([own[SAMPLE_COLUMNS], per_seed[SAMPLE_COLUMNS]], ignore_index=True)
    both["value"] = both["value"].astype(float)
    return both.sort_values(["row", "metric", "run_id"], kind="stable").reset_index(drop=True)
