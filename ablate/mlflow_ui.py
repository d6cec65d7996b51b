"""Where to look at runs in the MLflow UI: the line the ``ablate`` command ends with, a link to the
experiment's runs page in the model-training workflow (MLflow 3's UI opens the GenAI traces page unless the
link says ``workflowType=machine_learning``), filtered to a study's finished trials and sorted by run name so
that none is folded under the study's parent run."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import quote, urlencode

#: Where ``mlflow ui`` (and ``mlflow server``) listens unless told otherwise.
DEFAULT_UI = "http://127.0.0.1:5000"


def runs_url(base: str, experiment_id: str, study: str | None = None) -> str:
    """The runs page of an experiment in the model-training workflow; with ``study``, only the
    study's trial runs, sorted by name (so none is folded under the study's parent run)."""
    query = {"workflowType": "machine_learning"}
    if study is not None:
        query["searchFilter"] = f"{trials_filter(study)} and attributes.status = 'FINISHED'"
        query |= {"orderByKey": "tags.`mlflow.runName`", "orderByAsc": "true"}
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"


def trials_filter(study: str) -> str:
    """MLflow's filter for the trial runs of ``study``."""
    q = '"' if "'" in study else "'"  # MLflow's filter has no escapes
    return f"tags.`ablate.study` = {q}{study}{q} and tags.`ablate.role` = 'trial'"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """One run's page, in the model-training workflow."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def _locate(uri: str, study: str | None, run_id: str | None) -> tuple[str, str | None, int] | None:
    """(experiment id, run id or None, the study's trial runs that did not finish) of what to show;
    None when the store does not say."""
    from mlflow import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        if run_id is not None:
            return client.get_run(run_id).info.experiment_id, run_id, 0
        exp = client.get_experiment_by_name(study) if study else None
        if exp is None or study is None:
            return None
        stopped = client.search_runs([exp.experiment_id], f"{trials_filter(study)} and attributes.status != 'FINISHED'")
        return exp.experiment_id, None, len(stopped)
    except Exception:  # noqa: BLE001 - a hint, never an error
        return None


def hint(uri: str, *, study: str | None = None, run_id: str | None = None) -> list[str]:
    """The lines that say how to open the UI on ``uri`` and what to open: the study's trials
    (``study``) or one run (``run_id``)."""
    if uri.startswith(("http://", "https://")):
        base, lines = uri, ["compare runs in the MLflow UI:"]
    else:
        mlflow = Path(sys.executable).with_name("mlflow")
        exe = mlflow if mlflow.exists() else Path("mlflow")
        base, lines = DEFAULT_UI, [f"compare runs in the MLflow UI: {exe} ui --backend-store-uri {uri}"]
    found = _locate(uri, study, run_id)
    if found is None:
        return [lines[0] + (f" {base}" if base == uri else "")]
    exp_id, run, stopped = found
    url = run_url(base, exp_id, run) if run is not None else runs_url(base, exp_id, study)
    out = [f"{lines[0]} {url}"] if base == uri else [lines[0], f"  then open {url}"]
    if stopped:
        out.append(
            f"  (its finished trials; {stopped} stopped or failed attempt{'s' * (stopped != 1)} not listed: "
            "drop \"and attributes.status = 'FINISHED'\" from the search to see them)"
        )
    return out
