"""Read a study's trial runs, or an experiment's `ablate train` runs, back from MLflow as one flat row per run."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Run, ViewType

from ablate.lightning_modules.config.errors import StorageError
from ablate.reports.seeds import task_metric
from ablate.sweeps.engine.tracking import check_database

#: Columns every runs frame has, before the params and metrics.
BASE_COLUMNS = ["run_id", "run_name", "status", "state", "trial"]
#: Columns every stages frame (:func:`load_stages`) has, before the metrics.
STAGE_COLUMNS = ["run_id", "stage_run_id", "task", "seed", "task_metric"]
#: A chained trial's fine-tuning stage run: tag ``ablate.stage`` = ``finetune:<task>``
#: (``ablate.sweeps.engine.tracking.STAGE``), nested in the trial's run.
STAGE_TAG, FINETUNE, PARENT_TAG = "ablate.stage", "finetune:", "mlflow.parentRunId"

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")

# A report must fail fast on an unreachable server, not retry for minutes.
# Values the user set explicitly win.
_FAIL_FAST_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def parse_param(value: str | None) -> str | int | float | None:
    """Turn an MLflow param string back into a number where it looks like one.

    ``"64"`` -> 64, ``"0.1"`` -> 0.1, ``"None"`` -> None; anything else stays a string.
    """
    if value is None or value == "None":
        return None
    s = value.strip()
    if _INT.fullmatch(s):
        return int(s)
    if _FLOAT.fullmatch(s):
        return float(s)
    return value


@contextlib.contextmanager
def _fail_fast() -> Iterator[None]:
    added = [k for k in _FAIL_FAST_ENV if k not in os.environ]
    for k in added:
        os.environ[k] = _FAIL_FAST_ENV[k]
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def absent_store(tracking_uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI that does not exist (MLflow would create it), else None."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    name = unquote(urlparse(tracking_uri).path)[1:]  # sqlite:///rel.db -> rel.db, sqlite:////abs -> /abs
    path = Path(name)
    return path if name and name != ":memory:" and not path.exists() else None


def _check_sqlite(tracking_uri: str) -> None:
    """Refuse a ``sqlite:///`` URI whose file does not exist (MLflow would create it)."""
    if (path := absent_store(tracking_uri)) is not None:
        raise StorageError(f"{tracking_uri}: no MLflow database at {path}")


def _quote(value: str) -> str:
    """Quote a string for an MLflow filter (which has no escapes)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise StorageError(f"study name {value!r} has both quote characters; MLflow cannot filter on it")


def _search(client: MlflowClient, experiment_id: str, query: str) -> list[Run]:
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs(
            [experiment_id], query, run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _row(run: Run) -> dict[str, object]:
    tags = run.data.tags
    trial = parse_param(tags.get("ablate.trial"))
    row: dict[str, object] = {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "state": tags.get("ablate.state"),
        "trial": trial if isinstance(trial, int) else None,
    }
    row.update({k: parse_param(v) for k, v in run.data.params.items() if k not in row})
    row.update({k: float(v) for k, v in run.data.metrics.items() if k not in row})
    return row


def _frame(runs: list[Run]) -> pd.DataFrame:
    rows = [_row(r) for r in runs]
    params = sorted({k for r in runs for k in r.data.params} - set(BASE_COLUMNS))
    metrics = sorted({k for r in runs for k in r.data.metrics} - set(BASE_COLUMNS) - set(params))
    df = pd.DataFrame(rows, columns=[*BASE_COLUMNS, *params, *metrics])
    for col in ["trial", *params]:
        # all-number columns become numeric; with None (e.g. intra_dim "None" / 128) they stay
        # objects, so 128 is not turned into 128.0
        if df[col].notna().all():
            df[col] = df[col].infer_objects()
    if len(df):
        df = df.sort_values(["trial", "run_id"], na_position="last", kind="stable").reset_index(drop=True)
    return df


def _stage_row(run: Run) -> dict[str, object]:
    task = run.data.tags[STAGE_TAG].removeprefix(FINETUNE)
    seed = parse_param(run.data.params.get("seed"))
    row: dict[str, object] = {
        "run_id": run.data.tags.get(PARENT_TAG),
        "stage_run_id": run.info.run_id,
        "task": task,
        "seed": seed if isinstance(seed, int) else None,
        "task_metric": run.data.params.get("finetune.metric"),
    }
    return row | {k: float(v) for k, v in run.data.metrics.items() if task_metric(k)}


def load_stages(tracking_uri: str, study: str, trial_ids: list[str]) -> pd.DataFrame:
    """Read the finished fine-tuning stage runs of a study's chained trials ``trial_ids``.

    Returns:
        One row per stage run: :data:`STAGE_COLUMNS` (the trial's run id, the stage's, its task,
        its ``seed`` param, its ``finetune.metric``), then each fine-tuning task's metric it logged
        (:func:`ablate.reports.seeds.task_metric`: ``<task>/...``, ``mnli-mm/accuracy``).
        Where a retried trial fine-tuned a task with the same seed twice, the later run counts.
        No such runs: an empty frame.

    Raises:
        StorageError: the tracking store cannot be reached or read.
    """
    if not trial_ids:
        return pd.DataFrame(columns=STAGE_COLUMNS)
    wanted = set(trial_ids)
    with _fail_fast():
        try:
            client = MlflowClient(tracking_uri=tracking_uri)
            exp = client.get_experiment_by_name(study)
            query = f"tags.`{STAGE_TAG}` LIKE '{FINETUNE}%' AND attributes.status = 'FINISHED'"
            found = [] if exp is None else _search(client, exp.experiment_id, query)
        except Exception as exc:  # noqa: BLE001 - any failure talking to the store is a storage error
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StorageError(f"{tracking_uri}: cannot read MLflow tracking store ({first})") from exc
    found = sorted((r for r in found if r.data.tags.get(PARENT_TAG) in wanted), key=lambda r: r.info.start_time or 0)
    rows = [_stage_row(r) for r in found]
    metrics = sorted({k for r in rows for k in r} - set(STAGE_COLUMNS))
    frame = pd.DataFrame(rows, columns=[*STAGE_COLUMNS, *metrics])
    seeded = frame["seed"].notna()  # the same task and seed again: a retried trial's, the later counts
    again = frame[seeded].duplicated(["run_id", "task", "seed"], keep="last").reindex(frame.index, fill_value=False)
    return frame[~again].reset_index(drop=True)


def load_runs(tracking_uri: str, study: str) -> tuple[pd.DataFrame, str | None]:
    """Read a study's trial runs.

    Args:
        tracking_uri: MLflow tracking URI (``sqlite:///...``, ``http://...``).
        study: Study name = MLflow experiment name.

    Returns:
        A frame with one row per trial run (columns :data:`BASE_COLUMNS`, then
        every param by its dotted name with numbers converted back, then every
        metric's last value by its name), and the study's parent run id or None.
        An unknown experiment gives an empty frame.

    Raises:
        StorageError: the tracking store cannot be reached or read.
    """
    _check_sqlite(tracking_uri)
    check_database(tracking_uri)
    s = _quote(study)
    with _fail_fast():
        try:
            client = MlflowClient(tracking_uri=tracking_uri)
            exp = client.get_experiment_by_name(study)
            if exp is None:
                return pd.DataFrame(columns=BASE_COLUMNS), None
            trials = _search(client, exp.experiment_id, f"tags.`ablate.study` = {s} AND tags.`ablate.role` = 'trial'")
            parents = _search(client, exp.experiment_id, f"tags.`ablate.study` = {s} AND tags.`ablate.role` = 'study'")
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure talking to the store is a storage error
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StorageError(f"{tracking_uri}: cannot read MLflow tracking store ({first})") from exc
    parents.sort(key=lambda r: r.info.start_time or 0)
    return _frame(trials), (parents[0].info.run_id if parents else None)


#: A run's MLflow status -> its ``state`` column where it has no ``ablate.state`` tag (an ``ablate train`` run).
STATUS_STATE = {"FINISHED": "COMPLETE", "FAILED": "FAIL"}


@dataclass(frozen=True)
class ExperimentRuns:
    """An experiment's ``ablate train`` runs (:func:`load_experiment`).

    Attributes:
        frame: One row per run, as :func:`load_runs` makes them (its ``state``: COMPLETE for a FINISHED
            run, FAIL for a FAILED one, else its status).
        params, metrics: The frame's param and metric columns.
        started: The run ids, the earliest started first.
        others: Runs of the experiment that are not ``ablate train`` runs (a study's trials, stage runs).
    """

    frame: pd.DataFrame
    params: list[str]
    metrics: list[str]
    started: list[str]
    others: int

    @property
    def varying(self) -> list[str]:
        """The params whose values differ between the runs."""
        return [p for p in self.params if self.frame[p].astype(str).nunique(dropna=False) > 1]

    @property
    def shared(self) -> dict[str, object]:
        """The params every run has with the same value, and that value."""
        varying = set(self.varying)
        return {p: self.frame[p].iloc[0] for p in self.params if p not in varying and len(self.frame)}


def _matches(run: Run, where: dict[str, str]) -> bool:
    """Whether ``run`` has every ``key=value`` of ``where`` as a tag or a param (numbers compared as numbers)."""
    for key, value in where.items():
        found = run.data.tags.get(key, run.data.params.get(key))
        if found is None or parse_param(found) != parse_param(value):
            return False
    return True


def load_experiment(tracking_uri: str, experiment: str, where: dict[str, str] | None = None) -> ExperimentRuns:
    """Read the ``ablate train`` runs of an MLflow experiment (top-level runs of role ``run``), those with
    every ``key=value`` of ``where`` as a tag or param. An unknown experiment gives no runs.

    Raises:
        StorageError: the tracking store cannot be reached or read.
    """
    _check_sqlite(tracking_uri)
    check_database(tracking_uri)
    with _fail_fast():
        try:
            client = MlflowClient(tracking_uri=tracking_uri)
            exp = client.get_experiment_by_name(experiment)
            found = [] if exp is None else _search(client, exp.experiment_id, "")
        except Exception as exc:  # noqa: BLE001 - any failure talking to the store is a storage error
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StorageError(f"{tracking_uri}: cannot read MLflow tracking store ({first})") from exc
    mine = [r for r in found if r.data.tags.get("ablate.role", "run") == "run" and PARENT_TAG not in r.data.tags]
    runs = sorted((r for r in mine if _matches(r, where or {})), key=lambda r: r.info.start_time or 0)
    order = {r.info.run_id: i for i, r in enumerate(runs)}  # earliest first (no trial numbers to sort by)
    frame = _frame(runs).sort_values("run_id", key=lambda ids: ids.map(order)).reset_index(drop=True)
    states = [STATUS_STATE.get(r.info.status, r.info.status) for r in runs]
    frame["state"] = frame["state"].fillna(
        frame["run_id"].map(dict(zip([r.info.run_id for r in runs], states, strict=True)))
    )
    params = sorted({k for r in runs for k in r.data.params} - set(BASE_COLUMNS))
    metrics = [c for c in frame.columns if c not in BASE_COLUMNS and c not in params]
    return ExperimentRuns(frame, params, metrics, [r.info.run_id for r in runs], len(found) - len(mine))
