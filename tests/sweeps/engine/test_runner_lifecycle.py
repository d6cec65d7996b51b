"""A run's state is the truth: killed in any phase of a fine-tuning run with FastBERT's exits and Q-BERT's
QAT, ``ablate train`` ends its run KILLED with the signal and the phase as the reason, and exits with
128 + the signal's number; a run that fails after its training ends FAILED; the message says what
resumes the run, and that resumes it. Real processes (forked from a warm interpreter: tests/forked.py), real
MLflow (SQLite), real SST-2 and Wikipedia."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests import forked
from tests.conftest import ROOT, SHARED_DATA
from tests.sweeps.conftest import trained_run

SST2 = SHARED_DATA / "sst2"
PHASES = ("fine-tuning", "exits", "exit curve", "sensitivity", "QAT", "quantized evaluation", "latency")
"""The phases of the run below, in order, as its status lines and ``ablate.phase`` tag name them."""


@pytest.fixture(scope="module")
def config(tmp_path_factory, wiki_validation) -> Path:
    """A fine-tuning run of a tiny pre-trained model on 400 SST-2 sentences (scored on 32: the exit curve
    times each dev example at each speed), with exits and Q-BERT's QAT."""
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp = tmp_path_factory.mktemp("lifecycle")
    base, source = trained_run(tmp, wiki_validation)
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["trainer"]["measure"] = True  # the latency phase
    tree["finetune"] = {
        "source": f"runs:/{source.run_id}",
        "task": "sst2",
        "train": str(SST2 / "train.tsv"),
        "validation": str(SST2 / "validation.tsv"),
        "train_examples": 400,
        "validation_examples": 32,
        "max_length": 48,
        "batch_size": 16,
        "max_steps": 16,
        "val_every": 8,
        "patience": 3,
        "exits": True,
        "exit_steps": 6,
        "exit_speeds": [0.0, 0.5, 0.9],
    }
    tree["quant"] = {
        "method": "weight-mixed",
        "sensitivity": "hessian",
        "hessian_iters": 5,
        "calib_batches": 2,
        "low_bits": 2,
        "high_bits": 4,
        "high_fraction": 0.5,
        "group_size": 16,
        "qat_steps": 6,
    }
    path = tmp / "finetune.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return path


def _run(config: Path, *args: str, stop_at: str | None = None, sig: int = signal.SIGTERM) -> tuple[int, str]:
    """``ablate train`` of ``config`` in a new process; with ``stop_at``, ``sig`` is sent as soon as the
    run says it begins that phase. Its exit status and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = forked.popen(["train", *args], cwd=config.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if stop_at is not None and f": {stop_at}: " in line:
                proc.send_signal(sig)
                break
        seen.append(proc.stderr.read())
        return proc.wait(timeout=300), "".join(seen)
    finally:
        proc.kill()


def _last_run(config: Path) -> object:
    client = MlflowClient(f"sqlite:///{config.parent / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ablate")
    return client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)[0]


@pytest.mark.parametrize("phase", PHASES)
def test_sigterm_in_each_phase_ends_the_run_killed_with_the_phase(config, phase):
    code, err = _run(config, str(config), stop_at=phase)
    assert code == 143, err[-2000:]
    assert "Traceback" not in err
    run = _last_run(config)
    assert run.info.status == "KILLED"
    assert run.data.tags["ablate.fail_reason"] == f"signal SIGTERM during {phase}"
    assert run.data.tags["ablate.phase"] == phase
    last = err.strip().splitlines()[-1]
    if phase == "fine-tuning":  # stopped before its first validation: nothing to resume from
        assert last == (
            f"interrupted by SIGTERM: run {run.info.run_id} is KILLED; it was stopped before its first validation, "
            "so it kept no checkpoint and cannot be resumed: run the same command again to start it over"
        )
    else:
        store = f"sqlite:///{config.parent / 'runs' / 'mlflow.db'}"  # not ./ablate-runs: named
        assert last == (
            f"interrupted by SIGTERM: run {run.info.run_id} is KILLED; resume it with: "
            f"ablate train --resume {run.info.run_id} --tracking-uri {store}"
        )


def test_ctrl_c_after_a_validation_resumes_in_the_same_run_and_ends_finished(config):
    code, err = _run(config, str(config), stop_at="exit curve", sig=signal.SIGINT)
    assert code == 130, err[-2000:]
    killed = _last_run(config)
    assert killed.data.tags["ablate.fail_reason"] == "signal SIGINT during exit curve"
    advice = (
        f"ablate train --resume {killed.info.run_id} --tracking-uri sqlite:///{config.parent / 'runs' / 'mlflow.db'}"
    )
    assert err.strip().endswith(advice)

    code, err = _run(config, *advice.split()[2:])  # the command it says
    assert code == 0, err[-2000:]
    # its phases had ended: restored from the checkpoints they left, not trained again
    assert "phase 1 ended in an earlier attempt: restored from " in err
    assert "phase 2 ended in an earlier attempt: restored from " in err  # FastBERT's exits
    run = _last_run(config)
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    assert "ablate.fail_reason" not in run.data.tags and run.data.tags["ablate.resumed_from"]
    m = run.data.metrics
    assert {"sst2/final_accuracy", "sst2/speed_0.9/accuracy", "quant/avg_bits", "sst2/latency_ms"} <= set(m)
    statuses = {
        r.info.status
        for r in MlflowClient(f"sqlite:///{config.parent / 'runs' / 'mlflow.db'}").search_runs([run.info.experiment_id])
    }
    assert "RUNNING" not in statuses


def test_a_failure_after_training_ends_the_run_failed(config):
    """The run's artifact folder made unusable once its training is over (a file where its ``model/``
    artifacts go): logging the classifier fails, and the run ends FAILED with the reason, not FINISHED."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = forked.popen(
        ["train", str(config)], cwd=config.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if ": exit curve: " in line:  # after training, before the classifier's weights are logged
                run = _last_run(config)
                artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
                artifacts.mkdir(parents=True, exist_ok=True)
                (artifacts / "model").write_text("not a folder")
                break
        err = proc.stderr.read()
        code = proc.wait(timeout=300)
    finally:
        proc.kill()
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: "), err[-2000:]
    run = _last_run(config)
    assert run.info.status == "FAILED"
    assert run.data.tags["ablate.fail_reason"]
