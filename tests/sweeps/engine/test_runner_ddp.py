"""One trial on two CPU processes (Lightning DDP over gloo): one MLflow run, metrics logged once,
each rank on its own share of the stream, the trained weights back in the run, pruning across ranks."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import optuna
import pytest
import torch
from mlflow import MlflowClient

from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.sources import load_source
from tests import forked
from tests.sweeps.conftest import tiny_base, write_study

ROOT = Path(__file__).resolve().parents[3]
DDP = {"devices": 2, "accelerator": "cpu", "strategy": "ddp", "measure": False}


class RecordBatches(pl.Callback):
    """Each rank writes a digest of every training batch it sees to ``folder/rank<R>.txt``, and
    its model's weights at the start and the end of training to ``rank<R>_{start,end}.pt``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _save(self, trainer, pl_module, when: str) -> None:
        torch.save(pl_module.model.state_dict(), self.folder / f"rank{trainer.global_rank}_{when}.pt")

    def on_train_start(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module, "start")

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module, "end")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        digest = hashlib.sha1(batch["input_ids"].numpy().tobytes()).hexdigest()
        with (self.folder / f"rank{trainer.global_rank}.txt").open("a") as f:
            f.write(f"{trainer.world_size} {digest}\n")


def test_train_on_two_processes(tmp_path, wiki_validation):
    base = tiny_base(tmp_path, wiki_validation, **DDP)
    cfg = build_config(base)
    result = train(cfg, RunContext(callbacks=(RecordBatches(tmp_path),)))

    client = MlflowClient(result.tracking_uri)
    (exp,) = [e for e in client.search_experiments() if e.name == tracking.experiment_name(cfg.tracking.experiment)]
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [result.run_id]  # the ranks started no run of their own
    assert runs[0].info.status == "FINISHED"
    history = client.get_metric_history(result.run_id, "val/loss")
    steps = [h.step for h in history]
    assert len(steps) == 2 and len(set(steps)) == len(steps)  # validated at 3 and 6, each logged once
    assert history[-1].value == result.metrics["val/loss"]  # rank 0's metrics came back to this process

    shares = [(tmp_path / f"rank{r}.txt").read_text().split("\n")[:-1] for r in (0, 1)]
    assert [len(s) for s in shares] == [6, 6] and all(line.startswith("2 ") for s in shares for line in s)
    assert not set(shares[0]) & set(shares[1])  # each rank read its own share of the stream

    with tempfile.TemporaryDirectory() as tmp:
        logged = load_source(f"runs:/{result.run_id}", result.tracking_uri, Path(tmp)).model.state_dict()
    start, end = (torch.load(tmp_path / f"rank0_{when}.pt") for when in ("start", "end"))
    assert all(torch.equal(logged[k], v) for k, v in end.items())  # the run holds rank 0's trained weights
    assert not all(torch.equal(start[k], v) for k, v in end.items())
    ranks = [torch.load(tmp_path / f"rank{r}_end.pt") for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], v) for k, v in ranks[1].items())  # DDP kept the ranks in step


def test_pruning_across_ranks(tmp_path, wiki_validation):
    """Rank 0 reports to Optuna and the prune reaches every rank and the worker: the 6-step trial
    is pruned at its first report past the warm-up, the 2-step one (reporting only inside it) completes."""
    study = write_study(
        tmp_path,
        wiki_validation,
        name="ddp-prune",
        search={"trainer.max_steps": {"choices": [2, 6]}},
        trainer={**DDP, "val_every": 2},
        pruner={"type": "threshold", "upper": 1.0, "n_warmup_steps": 3},
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = forked.run(["sweep", str(study)], cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    trials = optuna.load_study(study_name="ddp-prune", storage=f"sqlite:///{tmp_path}/runs/optuna.db").trials
    by_steps = {t.params["trainer.max_steps"]: t for t in trials}
    assert by_steps[2].state == optuna.trial.TrialState.COMPLETE
    assert by_steps[6].state == optuna.trial.TrialState.PRUNED
    assert max(by_steps[6].intermediate_values) == 4  # stopped at the first report past the warm-up

    client = MlflowClient(f"sqlite:///{tmp_path}/runs/mlflow.db")
    exp = client.get_experiment_by_name("ddp-prune").experiment_id
    runs = client.search_runs([exp])
    assert Counter(r.data.tags["ablate.role"] for r in runs) == {"trial": 2, "study": 1}
    assert {r.info.status for r in runs} == {"FINISHED"}
    pruned = by_steps[6].user_attrs["mlflow_run_id"]
    assert len(client.get_metric_history(pruned, "val/loss")) == 2  # steps 2 and 4, not 6


def test_a_rank_that_hits_nan_fails_the_run_with_its_reason(tmp_path, wiki_validation):
    """The NaN guard raised in a rank reaches the worker as the FloatingPointError it is (what the
    study catches to fail the trial and go on), and the run ends FAILED."""
    base = tiny_base(tmp_path, wiki_validation, **DDP, max_steps=40, val_every=20)
    base["optim"]["lr"] = 1.0e9
    cfg = build_config(base)
    with pytest.raises(FloatingPointError, match=r"training loss became .* at step \d+"):
        train(cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/runs/mlflow.db")
    runs = client.search_runs(
        [client.get_experiment_by_name(tracking.experiment_name(cfg.tracking.experiment)).experiment_id]
    )
    assert [r.info.status for r in runs] == ["FAILED"]
