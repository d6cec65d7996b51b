"""The runs of the models a study trains once, by their names: the tags that say what a run's study
model is (a teacher only where it teaches), and stores written before the names changed (role
``teacher`` and ``ablate.teacher_config`` on every such run) still found, reused and ended."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from ablate.sweeps import study_model_runs
from ablate.sweeps.study_model_runs import model_tags, source_tag

STUDY = "s"


@pytest.fixture()
def store(tmp_path) -> tuple[MlflowClient, str]:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client, client.create_experiment(STUDY, artifact_location=str(tmp_path / "artifacts"))


def _run(client: MlflowClient, exp_id: str, status: str, **tags: str) -> str:
    run_id = client.create_run(exp_id, tags={"ablate.study": STUDY, **tags}).info.run_id
    if status != "RUNNING":
        client.set_terminated(run_id, status)
    return run_id


def test_the_study_model_is_a_teacher_only_where_it_teaches():
    assert source_tag("runs:/abc") == "abc" and source_tag("/models/m") == "/models/m"
    assert model_tags("runs:/abc", teaches=False) == {"ablate.study_model_run": "abc"}
    assert model_tags("runs:/abc", teaches=True) == {"ablate.study_model_run": "abc", "ablate.teacher_run": "abc"}


@pytest.mark.parametrize("tag", ["ablate.config_digest", "ablate.teacher_config"])
def test_a_finished_model_is_found_by_its_config_digest_new_or_old(store, tag):
    client, exp_id = store
    _run(client, exp_id, "FINISHED", **{"ablate.role": "trial", "ablate.trial": "0"})
    assert study_model_runs._finished(client, exp_id, STUDY, "d1") is None
    old_or_new = _run(client, exp_id, "FINISHED", **{"ablate.role": "teacher", tag: "d1"})
    _run(client, exp_id, "FAILED", **{"ablate.role": "prune_source", "ablate.config_digest": "d1"})
    assert study_model_runs._finished(client, exp_id, STUDY, "d1") == old_or_new
    assert study_model_runs._finished(client, exp_id, STUDY, "d2") is None


def test_a_dead_workers_model_runs_end_killed_whatever_their_role(store):
    client, exp_id = store
    ended = [
        _run(client, exp_id, "RUNNING", **{"ablate.role": role})
        for role in ("teacher", "prune_source", "reference")  # teacher: an old store's prune source too
    ]
    trial = _run(client, exp_id, "RUNNING", **{"ablate.role": "trial"})
    study_model_runs.mark_killed(client, exp_id, STUDY)
    assert [client.get_run(r).info.status for r in ended] == ["KILLED"] * 3
    assert client.get_run(trial).info.status == "RUNNING"


def test_a_stale_trial_of_a_helper_study_ends_the_model_it_trains(monkeypatch):
    killed: list[str] = []
    monkeypatch.setattr(study_model_runs, "mark_killed", lambda client, exp_id, name: killed.append("model"))
    mark = study_model_runs.on_stale(None, "0", STUDY, lambda trial: killed.append(f"trial {trial}"))
    for name in (STUDY, f"{STUDY}:trained-once", f"{STUDY}:trained-once:0123456789ab"):  # the last: a task teacher
        mark(SimpleNamespace(study_name=name), 7)
    assert killed == ["trial 7", "model", "model"]
