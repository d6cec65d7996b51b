"""Two workers, one study, on a real PostgreSQL (Optuna) and a real MLflow server.

The test installs Debian's PostgreSQL if it is missing, starts a private cluster and an
``mlflow server`` (PostgreSQL backend store, served artifacts) on loopback, runs two
``ablate sweep`` processes at once on one 6-configuration grid and checks that every
configuration ran exactly once, under one parent, and that the report builds from the
server. Everything it started is stopped, also when it fails.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from ablate.sweeps import workers
from ablate.sweeps.engine import tracking
from tests import forked
from tests.servers import mlflow_server, postgres_cluster
from tests.sweeps.conftest import write_study
from tests.sweeps.test_study_teacher import TEACHER_MODEL

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    with postgres_cluster() as pg:
        yield pg


@pytest.fixture(scope="module")
def servers(cluster, tmp_path_factory):
    optuna_url = cluster.create_database("optuna")
    with mlflow_server(cluster.create_database("mlflow"), tmp_path_factory.mktemp("artifacts")) as srv:
        yield optuna_url, srv.url


def _open(url: str, start: threading.Barrier) -> str:
    start.wait()
    try:
        workers.storage(url, 10, lambda study, trial: None)
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the test reports whatever went wrong
        return f"{type(exc).__name__}: {exc}"


def test_workers_opening_an_empty_database_at_once(cluster):
    """Workers started together race to create Optuna's tables; every one of them gets the storage."""
    url = cluster.create_database("optuna_race")
    start = threading.Barrier(6)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(_open, [url] * 6, [start] * 6))
    assert results == ["ok"] * 6


def _tag(client: MlflowClient, run_id: str, start: threading.Barrier, tag: Callable[..., None]) -> str:
    start.wait()
    try:
        tag(client, run_id, {"ablate.storage": "postgresql://x/optuna", "ablate.overrides": "seed=1"})
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the test reports whatever went wrong
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def _race(client: MlflowClient, run_id: str, tag: Callable[..., None]) -> list[str]:
    start = threading.Barrier(6)
    with ThreadPoolExecutor(6) as pool:
        return list(pool.map(_tag, [client] * 6, [run_id] * 6, [start] * 6, [tag] * 6))


def test_workers_tagging_the_study_run_at_once(servers):
    """Workers starting together set the same tags on the study's parent run: MLflow's server (PostgreSQL)
    refuses a tag inserted by another between its look and its write; ``set_tags_once`` takes that as set.
    A tag held with another value is replaced."""
    client = MlflowClient(servers[1])
    exp = client.create_experiment("tag-race")
    tries = [client.create_run(exp).info.run_id for _ in range(8)]

    def plain(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            client.set_tag(run_id, key, value)

    # the race the fix is for shows with MLflow's own set_tag (the test would prove nothing otherwise)
    assert any(r != "ok" for run_id in tries for r in _race(client, run_id, plain))
    for run_id in [client.create_run(exp).info.run_id for _ in range(8)]:
        assert _race(client, run_id, tracking.set_tags_once) == ["ok"] * 6
        assert client.get_run(run_id).data.tags["ablate.overrides"] == "seed=1"
    run_id = client.create_run(exp, tags={"ablate.overrides": "seed=0"}).info.run_id
    tracking.set_tags_once(client, run_id, {"ablate.overrides": "seed=1"})
    assert client.get_run(run_id).data.tags["ablate.overrides"] == "seed=1"
    # two workers ending one dead worker's run at once, each with its own reason: KILLED, one reason kept
    for run_id in [client.create_run(exp).info.run_id for _ in range(4)]:
        start = threading.Barrier(2)

        def end(reason: str, run_id: str = run_id, start: threading.Barrier = start) -> str:
            start.wait()
            tracking.end_killed(client, run_id, reason)
            return reason

        with ThreadPoolExecutor(2) as pool:
            reasons = list(pool.map(end, ["stale (worker a)", "stale (worker b)"]))
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.data.tags[tracking.FAIL_REASON] in reasons


def _worker(study: Path, storage: str, uri: str, cwd: Path, log: Path) -> forked.Forked:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    with log.open("w") as out:
        return forked.popen(
            ["sweep", str(study), "--storage", storage, "--tracking-uri", uri],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _two_workers(study: Path, storage: str, uri: str, tmp_path: Path) -> list[Path]:
    """Run two workers on ``study`` at once; both must exit 0 (their logs are returned)."""
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    procs = [_worker(study, storage, uri, tmp_path, log) for log in logs]
    try:
        codes = [p.wait(timeout=800) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill_group(signal.SIGKILL)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    return logs


@pytest.mark.timeout(900)
def test_two_workers_share_one_study(servers, tmp_path, wiki_validation):
    storage, uri = servers
    study = write_study(
        tmp_path,
        wiki_validation,
        name="two-workers",
        search={"model.sharing": {"choices": ["all", "none", "attn"]}, "model.embed_dim": {"choices": [16, 32]}},
        trainer={"max_steps": 4, "val_every": 2, "measure": False},
    )
    _two_workers(study, storage, uri, tmp_path)

    trials = optuna.load_study(study_name="two-workers", storage=storage).get_trials()
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 6
    assert Counter(tuple(sorted(t.params.items())) for t in complete).most_common(1)[0][1] == 1
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("two-workers").experiment_id
    (parent,) = client.search_runs([exp], "tags.`ablate.role` = 'study'")
    runs = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    assert len(runs) == 6 and all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parent.info.run_id}
    assert parent.info.status == "FINISHED"
    assert len({r.data.tags["ablate.worker"] for r in runs}) == 2  # the work was shared

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rep = forked.run(
        ["report", str(study), "--tracking-uri", uri, "--out", str(tmp_path / "report")],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    assert all(r.info.run_id in md for r in runs)
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "report")} >= {"report/report.md"}


@pytest.mark.timeout(900)
def test_two_workers_train_the_study_teacher_once(servers, tmp_path, wiki_validation):
    storage, uri = servers
    study = write_study(
        tmp_path,
        wiki_validation,
        name="two-teach",
        trainer={"max_steps": 4, "measure": False},
        teacher={"model": TEACHER_MODEL, "overrides": {"trainer.max_steps": 150}},
    )
    logs = _two_workers(study, storage, uri, tmp_path)

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("two-teach").experiment_id
    (teacher,) = client.search_runs([exp], "tags.`ablate.role` = 'teacher'")
    assert teacher.info.status == "FINISHED"
    runs = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    assert len(runs) == 2 and {r.data.tags["ablate.teacher_run"] for r in runs} == {teacher.info.run_id}
    helper = optuna.load_study(study_name="two-teach:trained-once", storage=storage).trials
    assert [t.state.name for t in helper].count("COMPLETE") == 1  # a racing second attempt, if any, FAILed
    said = [log.read_text() for log in logs]
    assert sum("teacher: training" in s for s in said) == 1
    assert sum("teacher: another worker is training it; waiting" in s for s in said) == 1  # the other waited


@pytest.mark.timeout(900)  # 600-step trials: 7.5 min beside another test file on 2 cores
def test_a_stopped_worker_leaves_the_study_run_to_the_one_that_goes_on(servers, tmp_path, wiki_validation):
    """SIGTERM to one of two workers mid-trial, once both trials have checkpointed: it exits 143; the study's
    run stays RUNNING while the other worker goes on, takes the stopped trial too, going on from its checkpoint
    in the stopped attempt's run, and ends the study FINISHED, without a reason."""
    storage, uri = servers
    search = {"model.sharing": {"choices": ["all", "none"]}, "model.num_ffn": {"choices": [1, 2]}}
    trainer = {"max_steps": 600, "val_every": 20}  # checkpointed long before it ends (200 steps: 8 s, too short)
    study = write_study(tmp_path, wiki_validation, name="one-stops", search=search, trainer=trainer)
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    procs = [_worker(study, storage, uri, tmp_path, log) for log in logs]
    client = MlflowClient(uri)
    try:
        deadline = time.monotonic() + 300
        # both workers mid-trial, the first one's trial with a checkpoint uploaded (one stopped while taking
        # its trial leaves it to go stale, and retried from the start: tests/sweeps/test_kill_resume.py)
        while _running_trials(storage, "one-stops") < 2 or not _checkpointed(client, "one-stops", logs[0]):
            assert all(p.poll() is None for p in procs), "\n".join(log.read_text()[-2000:] for log in logs)
            assert time.monotonic() < deadline, "the two workers never ran checkpointed trials at once"
            time.sleep(0.1)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=120) == 143, logs[0].read_text()[-3000:]
        said = "interrupted by SIGTERM: this worker's runs are KILLED; the other workers take its configuration"
        assert said in logs[0].read_text()
        exp = client.get_experiment_by_name("one-stops").experiment_id
        (parent,) = client.search_runs([exp], "tags.`ablate.role` = 'study'")
        assert procs[1].poll() is None, "the other worker ended before the study's run was looked at"
        assert parent.info.status == "RUNNING" and "ablate.fail_reason" not in parent.data.tags
        assert procs[1].wait(timeout=400) == 0, logs[1].read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill_group(signal.SIGKILL)
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and "ablate.fail_reason" not in parent.data.tags
    runs = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    assert [r.info.status for r in runs] == ["FINISHED"] * 4  # the stopped attempt's run went on
    assert len({r.data.tags["ablate.config_sha256"] for r in runs}) == 4
    (resumed,) = [r for r in runs if tracking.RESUMED in r.data.tags]
    for run in runs:  # the server removed each upload of last.ckpt once the next was whole
        kept = [a.path for d in ("checkpoints", "checkpoints/spare") for a in client.list_artifacts(run.info.run_id, d)]
        assert [p for p in kept if p.endswith("last.ckpt")] == [run.data.tags["ablate.checkpoint_uploaded"]]
    assert "ablate.fail_reason" not in resumed.data.tags
    trials = optuna.load_study(study_name="one-stops", storage=storage).trials
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 4 and len({tuple(sorted(t.params.items())) for t in done}) == 4
    (summary,) = [line for line in logs[1].read_text().splitlines() if line.startswith("study one-stops: {")]
    assert "'COMPLETE': 4" in summary  # the worker that went on took the stopped trial


def _checkpointed(client: MlflowClient, name: str, log: Path) -> bool:
    """Whether the trial a worker's ``log`` last began is running in study ``name`` and has uploaded a checkpoint."""
    begun = re.findall(r"^trial (\d+) \[", log.read_text(), re.M)
    exp = client.get_experiment_by_name(name)
    if not begun or exp is None:
        return False
    found = f"tags.`ablate.trial` = '{begun[-1]}' and attributes.status = 'RUNNING'"
    return any(
        client.list_artifacts(r.info.run_id, "checkpoints") for r in client.search_runs([exp.experiment_id], found)
    )


def _running_trials(storage: str, name: str) -> int:
    """How many of study ``name``'s trials are RUNNING (0 before it exists)."""
    try:
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    except KeyError:
        return 0
    return sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)


def _trials_started(storage: optuna.storages.BaseStorage) -> int:
    """How many trials the study ``faults`` has begun (0 before it exists)."""
    try:
        return len(optuna.load_study(study_name="faults", storage=storage).get_trials(deepcopy=False))
    except KeyError:
        return 0


def _runs_started(client: MlflowClient) -> int:
    """How many trial runs the study ``faults`` has begun in MLflow (0 before its experiment exists)."""
    exp = client.get_experiment_by_name("faults")
    return 0 if exp is None else len(client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'"))


@pytest.mark.timeout(400)
def test_two_workers_killed_at_random_moments_still_finish_every_configuration_once(servers, tmp_path, wiki_validation):
    """Faults: two workers are SIGKILLed at random moments, three times over, then run to the end.
    Every configuration is FINISHED exactly once in MLflow, no run is left RUNNING, the Optuna study
    is complete, and the report shows the grid's configurations, as an uninterrupted study's would."""
    storage, uri = servers
    grid = {"model.sharing": {"choices": ["all", "none"]}, "model.embed_dim": {"choices": [16, 32]}}
    study = write_study(
        tmp_path,
        wiki_validation,
        name="faults",
        search=grid,
        trainer={"max_steps": 4, "val_every": 2, "measure": False},
    )
    raw = study.read_text() + "heartbeat: 1\n"  # a killed worker's trial is stale (and retried) 3 s later
    study.write_text(raw)
    chance = random.Random(27)
    watch = optuna.storages.RDBStorage(storage)  # one pool for the polling below (PostgreSQL allows 100 clients)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    runs = MlflowClient(uri)
    for round_, victims in enumerate((2, 1, 2)):
        logs = [tmp_path / f"killed{round_}-{i}.log" for i in range(2)]
        # the first round's moment is counted from a trial's MLflow run (so at least one kill lands in a run:
        # training, logging or its end), the others' from a trial's start in Optuna (its set-up too)
        started = (lambda: _runs_started(runs)) if round_ == 0 else (lambda: _trials_started(watch))
        before = started()
        procs = [_worker(study, storage, uri, tmp_path, log) for log in logs]
        deadline = time.monotonic() + 120
        while started() == before and time.monotonic() < deadline:
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.2)
        # a random moment of a trial: set-up, training, logging, the end (in the first round, of its run's
        # first 0.2 s: a run of 4 steps can end within a second or two, and a kill after it leaves no KILLED,
        # resumed or taken-over run for the check below; seen once, in a loaded suite, on 2026-11-28)
        time.sleep(chance.uniform(0.0, 4.0) * (0.05 if round_ == 0 else 1.0))
        for p in chance.sample(procs, victims):
            if p.poll() is None:
                p.kill_group(signal.SIGKILL)
        for p in procs:  # a survivor finishes what it can, then exits
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill_group(signal.SIGKILL)
                p.wait()
    watch.remove_session()
    watch.engine.dispose()
    _two_workers(study, storage, uri, tmp_path)

    expected = {(s, e) for s in ("all", "none") for e in (16, 32)}
    trials = optuna.load_study(study_name="faults", storage=storage).get_trials()
    complete = Counter(
        (t.params["model.sharing"], t.params["model.embed_dim"])
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
    )
    assert set(complete) == expected and set(complete.values()) == {1}, complete
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("faults").experiment_id
    runs = client.search_runs([exp])
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"], "a run was left RUNNING"
    killed = [r for r in runs if r.info.status == "KILLED"]
    resumed = [r for r in runs if "ablate.resumed_from" in r.data.tags]
    taken = [r for r in runs if "ablate.finished_before_retry" in r.data.tags]
    # the kills hit trials mid-run: an attempt stopped before its first checkpoint stays KILLED (with its
    # reason), one stopped after it went on in its own run from the checkpoint, one whose run had finished
    # is taken by its retry as it is
    assert killed or resumed or taken
    assert all(r.data.tags.get("ablate.fail_reason") for r in killed)
    assert not any(r.data.tags.get("ablate.fail_reason") for r in resumed if r.info.status == "FINISHED")
    finished = Counter(
        (r.data.params["model.sharing"], int(r.data.params["model.embed_dim"]))
        for r in runs
        if r.data.tags.get("ablate.role") == "trial" and r.info.status == "FINISHED"
    )
    assert set(finished) == expected and set(finished.values()) == {1}, finished

    out = tmp_path / "report"
    rep = forked.run(
        ["report", str(study), "--tracking-uri", uri, "--out", str(out)], cwd=tmp_path, env=env, timeout=300
    )
    assert rep.returncode == 0, rep.stderr
    rows = pd.read_csv(out / "runs.csv")  # every attempt, with its state; the table counts COMPLETE ones
    used = rows[rows["state"] == "COMPLETE"]
    assert sorted(zip(used["model.sharing"], used["model.embed_dim"], strict=True)) == sorted(expected)
    assert f"Runs used ({len(expected)})" in (out / "report.md").read_text()
    assert set(rows["status"]) <= {"FINISHED", "KILLED"}
