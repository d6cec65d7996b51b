"""Experiments ablate creates say they hold model training (MLflow 3's ``mlflow.experimentKind``), and
the line the command ends with leads to the study's trials: real SQLite MLflow stores."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from mlflow import MlflowClient

from ablate.mlflow_ui import DEFAULT_UI, hint, run_url, runs_url
from ablate.sweeps.engine import tracking


@pytest.fixture()
def uri(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking.connect(uri)
    return uri


def test_a_created_experiment_is_a_model_training_one(uri: str) -> None:
    client = MlflowClient(tracking_uri=uri)
    exp_id = tracking.experiment_id(client, "quickstart", uri)
    assert client.get_experiment(exp_id).tags[tracking.EXPERIMENT_KIND] == "custom_model_development"
    assert tracking.experiment_id(client, "quickstart", uri) == exp_id  # found, not created twice


def test_an_older_experiment_gets_the_kind_and_a_chosen_kind_stays(uri: str) -> None:
    client = MlflowClient(tracking_uri=uri)
    older = client.create_experiment("made-before")  # by an earlier ablate, or by hand
    assert tracking.EXPERIMENT_KIND not in client.get_experiment(older).tags
    assert tracking.experiment_id(client, "made-before", uri) == older
    assert client.get_experiment(older).tags[tracking.EXPERIMENT_KIND] == tracking.MODEL_TRAINING
    chosen = client.create_experiment("genai", tags={tracking.EXPERIMENT_KIND: "genai_development"})
    tracking.experiment_id(client, "genai", uri)
    assert client.get_experiment(chosen).tags[tracking.EXPERIMENT_KIND] == "genai_development"


def _query(url: str) -> dict[str, str]:
    fragment = urlsplit(url).fragment  # the UI routes in the fragment: #/experiments/1/runs?...
    path, _, query = fragment.partition("?")
    return {"path": path, **{k: v[0] for k, v in parse_qs(query).items()}}


def test_the_link_shows_the_trials_of_the_study_unfolded(uri: str) -> None:
    client = MlflowClient(tracking_uri=uri)
    exp_id = tracking.experiment_id(client, "quickstart", uri)
    study = {tracking.ROLE: "study", tracking.STUDY: "quickstart"}
    parent = tracking.start_run(client, exp_id, "quickstart", study)
    trials = {
        tracking.start_run(client, exp_id, f"E={e}", {tracking.ROLE: "trial", tracking.STUDY: "quickstart"}, parent)
        for e in (32, 128)
    }
    for run_id in trials:
        tracking.end_run(client, run_id, "FINISHED")
    stopped = tracking.start_run(client, exp_id, "E=32", {tracking.ROLE: "trial", tracking.STUDY: "quickstart"}, parent)
    tracking.end_killed(client, stopped, "signal SIGTERM during pre-training")  # an attempt a later one replaced
    url = runs_url(DEFAULT_UI, exp_id, "quickstart")
    q = _query(url)
    assert url.startswith(f"{DEFAULT_UI}/#/experiments/{exp_id}/runs?") and q["path"] == f"/experiments/{exp_id}/runs"
    assert q["workflowType"] == "machine_learning"  # not the GenAI traces page MLflow 3 opens by default
    # sorted by anything but the start time, the UI lists nested runs on their own rows
    assert q["orderByKey"] == "tags.`mlflow.runName`" and q["orderByAsc"] == "true"
    # the filter is one MLflow accepts, and it finds exactly the study's finished trials
    assert {r.info.run_id for r in client.search_runs([exp_id], q["searchFilter"])} == trials
    *_, note = hint(uri, study="quickstart")  # and the hint says what it leaves out
    assert note == (
        "  (its finished trials; 1 stopped or failed attempt not listed: drop \"and attributes.status = 'FINISHED'\" "
        "from the search to see them)"
    )
    assert _query(run_url(DEFAULT_UI, exp_id, parent))["path"] == f"/experiments/{exp_id}/runs/{parent}"


def test_the_printed_lines(uri: str) -> None:
    client = MlflowClient(tracking_uri=uri)
    exp_id = tracking.experiment_id(client, "quickstart", uri)
    first, second = hint(uri, study="quickstart")
    assert first.startswith("compare runs in the MLflow UI: ") and f"ui --backend-store-uri {uri}" in first
    assert second == f"  then open {runs_url(DEFAULT_UI, exp_id, 'quickstart')}"
    run = tracking.start_run(client, exp_id, "one", {})
    assert hint(uri, run_id=run)[1] == f"  then open {run_url(DEFAULT_UI, exp_id, run)}"
    assert hint(uri, study="no-such-study") == [first]  # nothing to link to: the command alone


def test_a_server_is_the_ui_and_an_unreachable_one_still_gets_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = "http://127.0.0.1:9"  # nothing listens there: no link, but the line, and no error
    assert hint(server, study="quickstart") == [f"compare runs in the MLflow UI: {server}"]
