"""A fit's logger holds its metrics and sends them every SEND_EVERY seconds, before each checkpoint and at
the fit's end: each point keeps the step and time it was logged, and none is lost or sent twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mlflow import MlflowClient

from ablate.sweeps.engine import tracking, trainer
from ablate.sweeps.engine.trainer import run_logger


@pytest.fixture(autouse=True)
def _own_tracking_uri() -> Iterator[None]:
    # Lightning's logger sets MLflow's process-wide tracking URI (and its environment variable) when first
    # used; a fit undoes it, and so must these tests, or a later test's child process logs to their store
    with tracking.scoped_tracking_uri():
        yield


@pytest.fixture
def run(tmp_path) -> tuple[str, str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.new_sqlite_store(uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("held")
    return uri, client.create_run(experiment).info.run_id


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float, int]]:
    return [(m.step, m.value, m.timestamp) for m in MlflowClient(uri).get_metric_history(run_id, key)]


@pytest.mark.parametrize("synchronous", [True, False])
def test_metrics_are_held_until_the_flush_then_all_sent_with_their_steps(run, synchronous):
    uri, run_id = run
    logger = run_logger(uri, run_id, synchronous=synchronous)
    for step in range(30):
        logger.log_metrics({"train/loss": 10.0 - step, "lr": 0.1}, step=step)
    logger.flush()  # what a checkpoint and a fit's end call
    assert logger.held == []
    history = sorted(_history(uri, run_id, "train/loss"))
    assert [(s, v) for s, v, _ in history] == [(s, 10.0 - s) for s in range(30)]
    times = [t for _, _, t in history]
    assert times == sorted(times)  # each point's own time, not the send's
    assert len(_history(uri, run_id, "lr")) == 30


def test_nothing_is_sent_before_send_every_has_passed(run):
    uri, run_id = run
    logger = run_logger(uri, run_id, synchronous=True)
    logger.log_metrics({"train/loss": 1.0}, step=0)
    assert _history(uri, run_id, "train/loss") == []
    assert len(logger.held) == 1


def test_a_log_after_send_every_sends_everything_held(run, monkeypatch):
    uri, run_id = run
    logger = run_logger(uri, run_id, synchronous=True)
    logger.log_metrics({"train/loss": 1.0}, step=0)
    monkeypatch.setattr(trainer, "SEND_EVERY", 0.0)
    logger.log_metrics({"train/loss": 2.0}, step=1)
    assert [(s, v) for s, v, _ in _history(uri, run_id, "train/loss")] == [(0, 1.0), (1, 2.0)]
    assert logger.held == []


def test_more_than_one_batch_is_sent_in_mlflow_sized_parts(run):
    uri, run_id = run
    logger = run_logger(uri, run_id, synchronous=True)
    for step in range(700):  # 1,400 points: above MLflow's 1,000 metrics a batch
        logger.log_metrics({"a": float(step), "b": 1.0}, step=step)
    logger.finalize("success")
    assert len(_history(uri, run_id, "a")) == 700 and len(_history(uri, run_id, "b")) == 700


def test_a_resumed_fit_holds_only_steps_after_the_runs_history(run):
    uri, run_id = run
    first = run_logger(uri, run_id, synchronous=True)
    for step in range(5):
        first.log_metrics({"train/loss": float(step)}, step=step)
    first.flush()
    again = run_logger(uri, run_id, synchronous=True, going_on=True)
    again.offset = 0
    for step in range(3, 8):  # resumed from step 3's checkpoint: 3 and 4 are in the history already
        again.log_metrics({"train/loss": float(step)}, step=step)
    again.flush()
    assert [s for s, _, _ in sorted(_history(uri, run_id, "train/loss"))] == list(range(8))


def test_values_on_the_device_are_read_once_when_sent_with_their_steps(run, monkeypatch):
    """A log step's values handed over as one tensor are not read until the send, then all together in one
    read; each keeps its step and time, and a resumed fit's steps already in the history are left out."""
    import torch

    uri, run_id = run
    first = run_logger(uri, run_id, synchronous=True)
    first.log_metrics({"train/loss": 9.0}, step=0)
    first.flush()
    logger = run_logger(uri, run_id, synchronous=True, going_on=True)
    for step in range(4):
        logger.log_tensor(["train/loss", "train/tokens"], torch.tensor([10.0 - step, 64.0]), step=step)
    assert len(logger.unread) == 4 and _history(uri, run_id, "train/tokens") == []
    reads = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t, _tolist=torch.Tensor.tolist: reads.append(1) or _tolist(t))
    logger.flush()
    assert reads == [1] and logger.unread == []
    assert [(s, v) for s, v, _ in sorted(_history(uri, run_id, "train/loss"))] == [
        (0, 9.0),
        (1, 9.0),
        (2, 8.0),
        (3, 7.0),
    ]
    assert [(s, v) for s, v, _ in sorted(_history(uri, run_id, "train/tokens"))] == [(s, 64.0) for s in range(4)]
