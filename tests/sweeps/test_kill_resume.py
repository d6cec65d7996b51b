"""SIGKILL a worker mid-trial, run the same command again: the trial resumes from its checkpoint, in
the killed attempt's run.

Real processes (forked from a warm interpreter: tests/forked.py), a real SQLite Optuna storage with heartbeats
and a real MLflow store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import zipfile
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from ablate.lightning_modules.config.load import replace
from ablate.sweeps import workers
from ablate.sweeps.base import StudyBase
from ablate.sweeps.engine import checkpoints
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.interrupt import Interrupted
from ablate.sweeps.engine.runner import train
from ablate.sweeps.spec import StudySpec, load_study, trial_config
from ablate.sweeps.study import run_study
from tests import forked
from tests.sweeps.conftest import write_study
from tests.sweeps.test_study_teacher import TEACHER_MODEL

ROOT = Path(__file__).resolve().parents[2]


def _sweep(study: Path, log: Path, *stores: str) -> forked.Forked:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    with log.open("w") as out:
        return forked.popen(
            ["sweep", str(study), *stores],
            cwd=study.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill_at_first_checkpoint(study: Path, checkpoints: Path, pattern: str, *stores: str) -> None:
    """Start a worker on ``study``; SIGKILL it as soon as its first ``last.ckpt`` is written whole (an
    upload is a plain copy: one killed mid-copy is refused by the retry, tests/sweeps/engine/test_checkpoints.py)."""
    log = study.parent / "first.log"
    proc = _sweep(study, log, *stores)
    try:
        deadline = time.monotonic() + 400
        while not any(zipfile.is_zipfile(f) for f in checkpoints.glob(pattern)):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.05)
    finally:
        proc.kill_group(signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(900)
def test_sigkill_mid_trial_then_another_machine_resumes_and_counts_once(tmp_path, wiki_validation):
    """Two workers in two working directories (two machines) share only the Optuna and MLflow
    stores: the first is killed mid-trial, the second resumes that trial from the checkpoint the
    first uploaded to MLflow (the default when the store is not the worker's own SQLite file)."""
    made = write_study(
        tmp_path,
        wiki_validation,
        name="killed",
        search={"model.sharing": {"choices": ["all", "none"]}},
        trainer={"max_steps": 120, "val_every": 20, "measure": False},
        heartbeat=1,
    )
    raw = yaml.safe_load(made.read_text())
    raw["base"]["tracking"]["root"] = "runs"  # each machine's own, relative to where it runs
    first, second_dir = tmp_path / "machine-a", tmp_path / "machine-b"
    for folder in (first, second_dir):
        folder.mkdir()
        (folder / "killed.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    shared = tmp_path / "shared"
    shared.mkdir()
    storage, uri = f"sqlite:///{shared / 'optuna.db'}", f"sqlite:///{shared / 'mlflow.db'}"
    stores = ("--storage", storage, "--tracking-uri", uri)
    _kill_at_first_checkpoint(first / "killed.yaml", shared, "artifacts/**/checkpoints/last.ckpt", *stores)
    trials = optuna.load_study(study_name="killed", storage=storage).get_trials()
    assert [t.state.name for t in trials].count("RUNNING") == 1  # left behind by the dead worker
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("killed").experiment_id
    (killed,) = client.search_runs([exp], "tags.`ablate.role` = 'trial' and attributes.status = 'RUNNING'")
    assert killed.data.tags["ablate.checkpoints"] == "mlflow"

    second = _sweep(second_dir / "killed.yaml", tmp_path / "second.log", *stores)
    assert second.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-3000:]
    study = second_dir / "killed.yaml"

    trials = optuna.load_study(study_name="killed", storage=storage).get_trials()
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 2 and Counter(str(sorted(t.params.items())) for t in complete).most_common(1)[0][1] == 1
    assert "RUNNING" not in {t.state.name for t in trials}
    runs = client.search_runs([exp])
    assert "RUNNING" not in {r.info.status for r in runs}
    # the retry went on in the killed attempt's run, from the checkpoint the first machine uploaded
    resumed = client.get_run(killed.info.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["ablate.state"] == "COMPLETE"
    assert "ablate.fail_reason" not in resumed.data.tags
    finished = [r for r in runs if r.data.tags.get("ablate.role") == "trial" and r.info.status == "FINISHED"]
    assert len(finished) == 2 and resumed.info.run_id in {r.info.run_id for r in finished}
    assert int(resumed.data.tags["ablate.trial"]) >= 2  # the retry's trial number (trials 0 and 1 came first)
    step = int(resumed.data.tags["ablate.resumed_from"].rsplit("step ", 1)[1].rstrip(")"))
    assert 0 < step < 120
    history = client.get_metric_history(resumed.info.run_id, "train/loss")
    # one curve: (what the first attempt had sent before it was killed, then) the retry's, from the checkpoint on
    after = sorted(m.step for m in history if m.step > step)
    assert after and after[0] <= step + 2 and after[-1] >= 110
    assert str(second_dir) in resumed.data.tags["ablate.resumed_from"]  # downloaded there from the first's upload
    ckpts = sorted(p.name for p in (second_dir / "runs" / "checkpoints" / "killed").rglob("*.ckpt"))
    # per trial: last and best, and the end of its one phase
    assert ckpts == ["best.ckpt", "best.ckpt", "last.ckpt", "last.ckpt", "phase-0.ckpt", "phase-0.ckpt"]
    # each trial's (the killed attempt's run is the resumed one): its phase's end, and its newest last.ckpt
    # alone (uploaded into two folders in turn, the one before removed once the next is whole)
    for run in finished:
        uploaded = [
            a.path
            for folder in ("checkpoints", "checkpoints/spare")
            for a in client.list_artifacts(run.info.run_id, folder)
        ]
        newest = run.data.tags[checkpoints.UPLOADED]
        assert sorted(p for p in uploaded if p.endswith(".ckpt")) == sorted([newest, "checkpoints/phase-0.ckpt"])

    # the resumed trial ends where an uninterrupted run of the same config does
    spec, base = load_study(study)
    params = {"model.sharing": resumed.data.params["model.sharing"], "seed": 0}
    cfg = replace(trial_config(base, spec, params, None), {"tracking.root": str(tmp_path / "straight")})
    straight = train(cfg, RunContext(tracking_uri=f"sqlite:///{tmp_path / 'straight.db'}", experiment="straight"))
    assert resumed.data.metrics["val/loss"] == pytest.approx(straight.metrics["val/loss"], rel=1e-5, abs=1e-6)


@pytest.mark.timeout(900)
def test_sigkill_while_training_the_teacher_then_rerun_takes_it_over(tmp_path, wiki_validation):
    """The study's teacher is trained once: a worker killed while training it leaves a stale
    teacher trial; the next worker ends the dead teacher run KILLED and trains the teacher
    from its last checkpoint, then the students."""
    study = write_study(
        tmp_path,
        wiki_validation,
        name="teach",
        trainer={"max_steps": 4, "measure": False},
        heartbeat=1,
        teacher={"model": TEACHER_MODEL, "overrides": {"trainer.max_steps": 200, "trainer.val_every": 20}},
    )
    runs_dir = tmp_path / "runs"
    _kill_at_first_checkpoint(study, runs_dir / "checkpoints", "teach/*/last.ckpt")  # mid-teacher

    second = _sweep(study, tmp_path / "second.log")
    assert second.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-3000:]

    client = MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("teach").experiment_id
    teachers = client.search_runs([exp], "tags.`ablate.role` = 'teacher'", order_by=["attributes.start_time"])
    assert [r.info.status for r in teachers] == ["KILLED", "FINISHED"]
    assert "heartbeat stale" in teachers[0].data.tags["ablate.fail_reason"]
    assert "ablate.resumed_from" in teachers[1].data.tags  # went on from the dead attempt's checkpoint
    trials = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    assert len(trials) == 2 and {r.info.status for r in trials} == {"FINISHED"}
    assert {r.data.tags["ablate.teacher_run"] for r in trials} == {teachers[1].info.run_id}
    storage = f"sqlite:///{runs_dir / 'optuna.db'}"
    helper = optuna.load_study(study_name="teach:trained-once", storage=storage).trials
    assert sorted(t.state.name for t in helper) == ["COMPLETE", "FAIL"]


@pytest.mark.timeout(900)
def test_sigkill_in_a_later_phase_of_a_pruning_trial_then_rerun_resumes_in_that_phase(tmp_path, wiki_validation):
    """A schuBERT trial (gates, re-training, gates, re-training) killed in its third phase: the rerun
    restores the two phases that ended, goes on in the third from its checkpoint, in the same run, and
    ends where an uninterrupted run of the same config ends (the same metrics at the same steps)."""
    model = {"preset": "bert-tiny", "vocab_size": 1000, "embed_dim": 32, "hidden_dim": 32, "num_layers": 2}
    model |= {"num_heads": 4, "ffn_dim": 64, "max_position": 64, "dropout": 0.0}
    study = write_study(
        tmp_path,
        wiki_validation,
        name="pruned",
        search={"prune.target": {"choices": [0.7]}},
        trainer={"max_steps": 6, "val_every": 5, "measure": False},
        heartbeat=1,
        prune_source={"model": model, "overrides": {"trainer.max_steps": 6}},
    )
    raw = yaml.safe_load(study.read_text())
    raw["base"]["model"] = model
    # the third phase (gates): 48 steps, checkpointed from step 5 on, a window a busy machine's poll does not miss
    raw["base"]["prune"] = {"method": "schubert-all", "rounds": 2, "gate_steps": 48, "finetune_steps": 16}
    study.write_text(yaml.safe_dump(raw, sort_keys=False))
    checkpoints = tmp_path / "runs" / "checkpoints"
    # killed once the second phase has ended and the third has checkpointed (its first validation)
    log = study.parent / "first.log"
    proc = _sweep(study, log)
    try:
        deadline = time.monotonic() + 600
        while not (list(checkpoints.glob("pruned/*/phase-1.ckpt")) and _third_phase_checkpointed(checkpoints)):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the third phase never checkpointed"
            time.sleep(0.05)
    finally:
        proc.kill_group(signal.SIGKILL)
        proc.wait()

    second = _sweep(study, tmp_path / "second.log")
    assert second.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-3000:]
    said = (tmp_path / "second.log").read_text()
    assert "phase 1 ended in an earlier attempt: restored from " in said
    assert "phase 2 ended in an earlier attempt: restored from " in said
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pruned").experiment_id
    (trial,) = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    assert trial.info.status == "FINISHED" and "(phase 3, step " in trial.data.tags["ablate.resumed_from"]
    trials = optuna.load_study(study_name="pruned", storage=_storage(tmp_path)).trials
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "FAIL"]  # the dead worker's, then its retry

    # the same config, uninterrupted, from the same source
    spec, base = load_study(study)
    source = trial.data.tags["ablate.source_run"]
    cfg = trial_config(base, spec, {"prune.target": 0.7, "seed": 0}, f"runs:/{source}")
    straight = train(cfg, RunContext(experiment="straight"))
    for key in ("val/loss", "val/mlm_loss", "prune/params", "params.backbone"):
        want = client.get_metric_history(straight.run_id, key)
        got = {
            m.step: m.value
            for m in sorted(client.get_metric_history(trial.info.run_id, key), key=lambda m: m.timestamp)
        }
        assert {m.step for m in want} == set(got), key
        for m in want:
            assert got[m.step] == pytest.approx(m.value, rel=1e-5, abs=1e-6), (key, m.step)


def _third_phase_checkpointed(checkpoints: Path) -> bool:
    """Whether a trial's ``last.ckpt`` was written by its third phase (index 2)."""
    import torch

    for last in checkpoints.glob("pruned/*/last.ckpt"):
        try:
            if torch.load(last, map_location="cpu", weights_only=False).get("ablate_phase") == 2:
                return True
        except (EOFError, RuntimeError, OSError):  # being written
            continue
    return False


def _storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"


def _queued_study(tmp_path: Path, corpus: Path, name: str) -> tuple[StudySpec, StudyBase, str, str]:
    """A one-configuration study with 1 s heartbeats, made and queued (no trial run); its stores' URLs."""
    search, trainer = {"model.sharing": {"choices": ["all"]}}, {"max_steps": 4, "measure": False}
    made = write_study(tmp_path, corpus, name=name, search=search, trainer=trainer, heartbeat=1)
    spec, base = load_study(made)
    storage, uri = f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_study(spec, base, storage=storage, tracking_uri=uri, n_trials=0)  # the study, its queue and parent
    return spec, base, storage, uri


def test_a_trial_whose_worker_died_after_its_run_finished_is_not_trained_again(tmp_path, wiki_validation):
    """A worker SIGKILLed between its trial run's end and Optuna's record of it leaves a FINISHED run
    and a RUNNING trial. Made here as that worker leaves them (the trial taken from the queue with
    a heartbeat, its run trained and finished, nothing told): the next worker retries the stale trial
    and takes the finished run's value, so the configuration has one FINISHED run, not two."""
    spec, base, storage, uri = _queued_study(tmp_path, wiki_validation, "late")
    rdb = optuna.storages.RDBStorage(storage, heartbeat_interval=1, grace_period=3)
    dead = optuna.load_study(study_name="late", storage=rdb).ask()  # the queued configuration, RUNNING
    rdb.record_heartbeat(dead._trial_id)
    tags = {"ablate.role": "trial", "ablate.study": "late", "ablate.trial": str(dead.number)}
    cfg = trial_config(base, spec, {"model.sharing": "all", "seed": 0}, None)
    ran = train(cfg, RunContext(tracking_uri=uri, experiment="late", tags=tags))
    time.sleep(4)  # its heartbeat goes stale
    run_study(spec, base, storage=storage, tracking_uri=uri)

    trials = optuna.load_study(study_name="late", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].user_attrs["mlflow_run_id"] == ran.run_id
    assert trials[1].value == pytest.approx(ran.metrics["val/loss"])
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("late").experiment_id
    (finished,) = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    assert finished.info.run_id == ran.run_id and finished.info.status == "FINISHED"
    assert finished.data.tags["ablate.state"] == "COMPLETE" and finished.data.tags["ablate.trial"] == "1"
    assert finished.data.tags["ablate.finished_before_retry"] == "0"  # the dead attempt's trial


@pytest.mark.timeout(300)
def test_a_trial_whose_worker_stopped_before_its_first_heartbeat_is_retried(tmp_path, wiki_validation):
    """A worker killed between taking its trial and the trial's first heartbeat (or one using Optuna's own
    storage) leaves a RUNNING trial Optuna never finds stale; made here as Optuna's own storage leaves it.
    The next worker fails it once its grace period is over and runs the configuration (before: it waited
    on it for ever, "waiting for 1 running trial(s) of other workers")."""
    spec, base, storage, uri = _queued_study(tmp_path, wiki_validation, "unbeaten")
    plain = optuna.storages.RDBStorage(storage, heartbeat_interval=1, grace_period=3)
    optuna.load_study(study_name="unbeaten", storage=plain).ask()  # taken, RUNNING, no heartbeat
    run_study(spec, base, storage=storage, tracking_uri=uri)

    trials = optuna.load_study(study_name="unbeaten", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].params == {"model.sharing": "all", "seed": 0}


def test_a_worker_stopped_while_taking_its_trial_releases_it(tmp_path, wiki_validation, monkeypatch):
    """A SIGTERM that lands in Optuna's ``ask`` (here: in the grid sampler's ``before_trial``) stops the worker
    before its trial began: the trial is failed at once, marked stopped, rather than left RUNNING until its
    grace period; the study's run ends KILLED (no other worker goes on) and the same command runs it again."""
    made = write_study(tmp_path, wiki_validation, name="in-ask", trainer={"max_steps": 4, "measure": False})
    spec, base = load_study(made)
    storage, uri = f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    taking = workers.QueuedGridSampler.before_trial

    def signalled(self, study, trial):
        taking(self, study, trial)
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(workers.QueuedGridSampler, "before_trial", signalled)
    with pytest.raises(Interrupted) as stop:
        run_study(spec, base, storage=storage, tracking_uri=uri)
    monkeypatch.undo()
    assert not stop.value.others_go_on
    stopped, queued = optuna.load_study(study_name="in-ask", storage=storage).get_trials()
    assert stopped.state.name == "FAIL" and stopped.user_attrs[workers.INTERRUPTED] == "SIGTERM"
    assert queued.state.name == "WAITING"
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("in-ask").experiment_id])
    assert parent.info.status == "KILLED" and parent.data.tags["ablate.fail_reason"] == "signal SIGTERM"
    run_study(spec, base, storage=storage, tracking_uri=uri)
    states = [t.state.name for t in optuna.load_study(study_name="in-ask", storage=storage).get_trials()]
    assert states == ["FAIL", "COMPLETE", "COMPLETE"]
