"""A two-trial sweep end to end on real text into temporary MLflow and Optuna stores, then its report."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import lightning.pytorch as pl
import optuna
import torch
from lightning.pytorch.callbacks import Callback
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.reports.build import build_report
from ablate.reports.spec import ReportSpec
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.runner import train
from ablate.sweeps.spec import load_study
from ablate.sweeps.study import run_study
from tests import forked
from tests.sweeps.conftest import tiny_base, write_study


def _client(tmp_path) -> tuple[MlflowClient, str]:
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    return MlflowClient(uri), uri


def test_two_trial_sweep_report_and_resume(study_file, tmp_path, capsys):
    assert main(["sweep", str(study_file)]) == 0
    storage = f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    study = optuna.load_study(study_name="tiny", storage=storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert sorted(t.params["model.sharing"] for t in study.trials) == ["all", "none"]
    assert all(sorted(t.intermediate_values) == [3, 6] for t in study.trials)  # one report per validation

    client, uri = _client(tmp_path)
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("ablate.role") == "study"]
    trials = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
    assert len(parent) == 1 and len(trials) == 2
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {parent[0].info.run_id}
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {r.info.run_id for r in trials}
    for run in trials:
        assert run.data.params["model.embed_dim"] == "16" and run.data.params["seed"] == "0"
        assert {
            "val/loss",
            "val/mlm_acc",
            "val/sentence_acc",
            "params.backbone",
            "flops_per_token",
            "latency_ms_b1",
            "latency_ms_b32",
            "train_activation_mb",
        } <= set(run.data.metrics)
        assert run.data.params["measure.device"] == f"cpu ({torch.get_num_threads()} threads)"  # where it trained
        assert "ablate.git_commit" in run.data.tags or "ablate.version" in run.data.tags
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "tokenizer"} <= artifacts
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert len(history) >= 1
    by_sharing = {r.data.params["model.sharing"]: r.data.metrics["params.backbone"] for r in trials}
    assert by_sharing["all"] < by_sharing["none"]

    # the report comes from MLflow alone
    spec, _ = load_study(study_file)
    out = tmp_path / "report"
    result = build_report(ReportSpec.from_mapping(spec.report), "tiny", uri, out)
    table = (out / "report.md").read_text()
    assert "all" in table and "none" in table
    assert all(r.info.run_id in table for r in trials)
    assert (out / "report.tex").read_text().count(r"\toprule") == 1
    assert len(result.plots) == 1 and result.plots[0].stat().st_size > 5000
    parent_artifacts = {a.path for a in client.list_artifacts(parent[0].info.run_id, "report")}
    assert "report/report.md" in parent_artifacts

    # running the same command again continues the study: nothing left to do
    assert main(["sweep", str(study_file)]) == 0
    assert len(optuna.load_study(study_name="tiny", storage=storage).trials) == 2


def test_same_seed_same_numbers(tmp_path, wiki_validation):
    cfg = build_config(tiny_base(tmp_path, wiki_validation))
    first = train(cfg)
    second = train(cfg)
    assert first.metrics["val/loss"] == second.metrics["val/loss"]
    assert first.metrics["train/loss"] == second.metrics["train/loss"]
    other = train(build_config(tiny_base(tmp_path, wiki_validation), {"seed": 1}))
    assert other.metrics["val/loss"] != first.metrics["val/loss"]


def _second_trial_running(storage: str) -> bool:
    """Whether the study's trial 1 is RUNNING."""
    try:
        trials = optuna.load_study(study_name="interrupted", storage=storage).trials
    except Exception:  # noqa: BLE001 - the study or its database is not there yet
        return False
    return any(t.number == 1 and t.state == optuna.trial.TrialState.RUNNING for t in trials)


def _second_checkpoint_mid_run(checkpoints: Path) -> bool:
    """Whether exactly two trials have kept a checkpoint and the newer one is from before its last step (so
    that trial is still pre-training). Files only: it also runs while the sweep is stopped, which may hold
    the Optuna database's lock."""
    try:
        kept = sorted(checkpoints.glob("*/last.ckpt"), key=lambda f: f.stat().st_mtime)
        if len(kept) != 2:
            return False
        step = torch.load(kept[-1], map_location="cpu", weights_only=False)["global_step"]
        return bool(step < 200)
    except Exception:  # noqa: BLE001 - a checkpoint is not (wholly) there yet
        return False


def test_a_signal_kills_the_trial_and_the_rerun_goes_on_in_its_run(tmp_path, wiki_validation, capsys):
    """SIGTERM (a cluster's preemption) once the second trial has kept a checkpoint: the command ends with
    143 and says what resumes the study; the trial's run is KILLED with the signal and its phase as the
    reason, the Optuna trial is counted INTERRUPTED; the same command again goes on in that run from its
    checkpoint, and the link it prints lists the finished trials."""
    search = {"model.sharing": {"choices": ["all", "none"]}, "model.num_ffn": {"choices": [1, 2]}}
    path = write_study(
        tmp_path, wiki_validation, name="interrupted", search=search, trainer={"max_steps": 200, "val_every": 25}
    )
    client, _ = _client(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "sweep.log"  # a file, not a pipe: a pipe nobody reads while the sweep runs can fill and stall it
    with open(log, "w", encoding="utf-8") as out:
        proc = forked.popen(["sweep", str(path)], cwd=os.getcwd(), env=env, stdout=out, stderr=subprocess.STDOUT)
    storage = f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    checkpoints = tmp_path / "runs" / "checkpoints" / "interrupted"
    try:
        deadline, second_checkpointed = time.time() + 300, False
        while time.time() < deadline and proc.poll() is None and not second_checkpointed:
            if _second_checkpoint_mid_run(checkpoints) and _second_trial_running(storage):
                # stopped while looked at, so that the signal lands where the look saw the sweep (a busy
                # machine could otherwise finish the trial between the look and the signal)
                proc.send_signal(signal.SIGSTOP)
                second_checkpointed = _second_checkpoint_mid_run(checkpoints)
                if second_checkpointed:
                    proc.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.2)
        if not second_checkpointed:
            proc.kill()
        proc.wait(timeout=120)
    finally:
        proc.kill()
    output = log.read_text(encoding="utf-8")
    assert second_checkpointed, f"the second trial was never seen with a checkpoint (exit {proc.returncode}):\n{output}"
    assert proc.returncode == 143, output
    assert "Traceback" not in output
    assert (
        "interrupted by SIGTERM: the study's running runs are KILLED; resume the study with the same command "
        f"(ablate sweep {path})" in output
    )
    # each trial says its number, its place among the study's trials and its configuration; the stopped one how it ended
    assert re.search(r"^trial 0 \[1/4\]: sharing=\w+ F=\d seed=0$", output, re.M), output
    assert re.search(r"^trial 1 \[\d/4\]: sharing=\w+ F=\d seed=0$", output, re.M), output
    assert re.search(r"^trial 1: interrupted by SIGTERM after [\d.]+ s$", output, re.M), output
    exp = client.get_experiment_by_name("interrupted")
    runs = client.search_runs([exp.experiment_id])
    assert "RUNNING" not in {r.info.status for r in runs}
    (killed,) = [r for r in runs if r.data.tags.get("ablate.role") == "trial" and r.info.status == "KILLED"]
    assert killed.data.tags["ablate.fail_reason"] == "signal SIGTERM during pre-training"
    assert killed.data.tags["ablate.state"] == "INTERRUPTED"
    (parent,) = [r for r in runs if r.data.tags.get("ablate.role") == "study"]
    assert parent.info.status == "KILLED" and parent.data.tags["ablate.fail_reason"] == "signal SIGTERM"
    (stopped,) = [t for t in optuna.load_study(study_name="interrupted", storage=storage).trials if t.number == 1]
    assert stopped.state == optuna.trial.TrialState.FAIL and stopped.user_attrs["ablate.interrupted"] == "SIGTERM"

    capsys.readouterr()
    assert main(["sweep", str(path)]) == 0
    out = capsys.readouterr()
    assert "study interrupted: {" in out.out and "'COMPLETE': 4" in out.out and "'INTERRUPTED': 1" in out.out
    assert "'FAIL'" not in out.out
    assert f"(going on in run {killed.info.run_id} from its checkpoint)" in out.err
    assert "and%20attributes.status%20%3D%20%27FINISHED%27" in out.out  # the link lists the finished trials
    study = optuna.load_study(study_name="interrupted", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted((t.params["model.sharing"], t.params["model.num_ffn"]) for t in complete) == [
        ("all", 1),
        ("all", 2),
        ("none", 1),
        ("none", 2),
    ]
    runs = client.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
    assert len(trials) == 4 and {r.info.status for r in trials} == {"FINISHED"}  # no second run for the trial
    resumed = client.get_run(killed.info.run_id)
    assert resumed.data.tags["ablate.state"] == "COMPLETE" and resumed.data.tags["ablate.resumed_from"]
    (parent,) = [r for r in runs if r.data.tags.get("ablate.role") == "study"]
    assert parent.info.status == "FINISHED" and "ablate.fail_reason" not in parent.data.tags
    steps = [m.step for m in client.get_metric_history(killed.info.run_id, "train/loss")]
    assert min(steps) < 50 and max(steps) >= 190  # one curve, from the first attempt to the end


def test_an_edited_study_is_refused_naming_what_changed(tmp_path, wiki_validation, capsys):
    """The same study name with other settings than its trials ran with: one line naming the change,
    exit 2, nothing run; the unchanged study still resumes (nothing left to do)."""
    path = write_study(tmp_path, wiki_validation, name="edited", trainer={"measure": False})
    assert main(["sweep", str(path)]) == 0
    storage = f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    client, _ = _client(tmp_path)
    exp = client.get_experiment_by_name("edited")
    before = len(client.search_runs([exp.experiment_id]))
    edited = write_study(tmp_path, wiki_validation, name="edited", trainer={"measure": False, "max_steps": 3})
    capsys.readouterr()
    assert main(["sweep", str(edited)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {edited}: study 'edited' was edited since its 2 trials ran: base trainer.max_steps: 3 here, 6 in "
        "them; running it would mix them with the edited study's: give the edited study a new name (name:)"
    )
    searched = write_study(
        tmp_path,
        wiki_validation,
        name="edited",
        trainer={"measure": False},
        search={"model.sharing": {"choices": ["all"]}},
    )
    assert main(["sweep", str(searched)]) == 2
    err = capsys.readouterr().err
    assert "search.model.sharing: choices ['all'] here, but the study 'edited'" in err
    assert "sampled choices ['all', 'none'] (trial 0)" in err
    assert len(client.search_runs([exp.experiment_id])) == before
    assert len(optuna.load_study(study_name="edited", storage=storage).trials) == 2
    write_study(tmp_path, wiki_validation, name="edited", trainer={"measure": False})  # as it was
    assert main(["sweep", str(path)]) == 0


def test_pruned_trials_are_recorded_and_count_as_done(tmp_path, wiki_validation):
    """optuna-integration's Lightning callback prunes on the validation loss; a threshold no
    loss can meet prunes every trial at its first validation."""
    path = write_study(tmp_path, wiki_validation, name="pruned", pruner={"type": "threshold", "upper": 0.01})
    assert main(["sweep", str(path)]) == 0
    study = optuna.load_study(study_name="pruned", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.PRUNED] * 2
    assert all(list(t.intermediate_values) == [3] for t in study.trials)  # reported at step 3, the first validation
    client, _ = _client(tmp_path)
    exp = client.get_experiment_by_name("pruned")
    trials = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'")
    assert {(r.info.status, r.data.tags["ablate.state"]) for r in trials} == {("FINISHED", "PRUNED")}
    assert main(["sweep", str(path)]) == 0  # pruned trials are done: nothing reruns
    assert (
        len(optuna.load_study(study_name="pruned", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}").trials) == 2
    )


def test_a_nan_loss_fails_its_trial_with_the_reason_and_the_study_goes_on(tmp_path, wiki_validation):
    """A learning rate of 1e9 overflows within a few steps: that trial fails (stopped at once,
    reason in Optuna and MLflow); the sane one completes."""
    path = write_study(
        tmp_path,
        wiki_validation,
        name="nan",
        search={"optim.lr": {"choices": [1.0e-3, 1.0e9]}},
        trainer={"max_steps": 60, "val_every": 30, "measure": False},
    )
    assert main(["sweep", str(path)]) == 0
    study = optuna.load_study(study_name="nan", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}")
    states = {t.params["optim.lr"]: t for t in study.trials}
    assert states[1.0e-3].state == optuna.trial.TrialState.COMPLETE
    failed = states[1.0e9]
    assert failed.state == optuna.trial.TrialState.FAIL
    reason = failed.user_attrs["ablate.fail_reason"]
    assert reason.startswith("FloatingPointError: training loss became") and "at step" in reason
    step = int(reason.split("at step ")[1].split()[0])
    assert step < 60
    client, _ = _client(tmp_path)
    exp = client.get_experiment_by_name("nan").experiment_id
    (run,) = client.search_runs([exp], "tags.`ablate.state` = 'FAIL'")
    assert run.info.status == "FAILED" and run.data.tags["ablate.fail_reason"] == reason
    assert not client.search_runs([exp], "attributes.status = 'RUNNING'")


class _OtherWorkerStops(Callback):
    """Ends the study's run KILLED at a trial's first step, as another worker's SIGTERM does while this one goes on."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        client = MlflowClient(self.uri)
        (parent,) = client.search_runs(
            [client.get_experiment_by_name("shared").experiment_id], "tags.`ablate.role` = 'study'"
        )
        if parent.info.status == "RUNNING":
            tracking.end_killed(client, parent.info.run_id, "signal SIGTERM")


def test_a_worker_that_goes_on_after_another_stopped_ends_the_study_run_finished(tmp_path, wiki_validation):
    """Another worker's SIGTERM ends the shared study run KILLED with its reason; the worker that finishes
    the study ends it FINISHED, without that reason."""
    spec, base = load_study(write_study(tmp_path, wiki_validation, name="shared", trainer={"measure": False}))
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    result = run_study(spec, base, tracking_uri=uri, hooks=RunContext(callbacks=(_OtherWorkerStops(uri),)))
    parent = MlflowClient(uri).get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED" and tracking.FAIL_REASON not in parent.data.tags
