"""Resume in every phase of every regime: a run stopped mid-phase (after a checkpoint, as a killed
process stops) and resumed in the same run ends where an uninterrupted run ends: the same metrics at
the same steps, the same weights. Real MLflow stores and checkpoints, real text and SST-2."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine import checkpoints, runner
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.interrupt import Interrupted
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.tracking import RESUMED
from tests.sweeps.conftest import trained_run

SST2 = Path(__file__).resolve().parents[4] / "shared" / "data" / "sst2"
TIMED = ("latency", "_ms", "throughput", "memory", "seconds")
"""Metrics that time the machine, not the run: left out of the comparison."""


class StopIn(pl.Callback):
    """Ctrl-C at step ``step`` of the run's ``fit``-th fit (1-based): a phase stopped midway."""

    def __init__(self, fit: int, step: int) -> None:
        self.fit, self.step, self.fits = fit, step, 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.fits += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.fits == self.fit and trainer.global_step == self.step:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def source(tmp_path_factory, wiki_validation) -> tuple[dict, str]:
    model = {"preset": "bert-tiny", "vocab_size": 1000, "embed_dim": 32, "hidden_dim": 32, "num_layers": 2}
    model |= {"num_heads": 4, "ffn_dim": 64, "max_position": 64, "dropout": 0.0}  # per-layer modules: prunable
    base, run = trained_run(tmp_path_factory.mktemp("resume-source"), wiki_validation, model)
    return base, f"runs:/{run.run_id}"


def _tree(base: dict, regime: str, source: str) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    if regime == "prune":  # gates 1, re-training 1, gates 2, re-training 2
        tree["prune"] = {"source": source, "method": "schubert-all", "rounds": 2, "gate_steps": 5, "finetune_steps": 5}
    elif regime == "quant":  # Q-BERT's QAT on the pre-trained model
        tree["quant"] = {"source": source, "method": "weight-int4", "qat_steps": 5, "group_size": 16}
    elif regime == "distill":
        tree["distill"] = {"teacher": source, "kd_weight": 1.0}
    elif regime == "finetune":  # fine-tuning, FastBERT's exits, Q-BERT's QAT
        if not (SST2 / "train.tsv").is_file():
            pytest.skip(f"shared test data not found at {SST2}")
        tree["finetune"] = {
            "source": source,
            "task": "sst2",
            "train": str(SST2 / "train.tsv"),
            "validation": str(SST2 / "validation.tsv"),
            "train_examples": 256,
            "validation_examples": 64,
            "max_length": 48,
            "batch_size": 16,
            "max_steps": 10,
            "val_every": 3,
            "patience": 5,
            "exits": True,
            "exit_steps": 4,
            "exit_speeds": [0.0, 0.9],
        }
        tree["quant"] = {"method": "weight-int4", "qat_steps": 5, "group_size": 16}
    return tree


def _history(client: MlflowClient, run_id: str) -> dict[str, dict[int, float]]:
    """Every metric's last value at each step (a resumed phase logs again the steps after its checkpoint)."""
    out: dict[str, dict[int, float]] = {}
    for key in client.get_run(run_id).data.metrics:
        if any(t in key for t in TIMED):
            continue
        for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
            out.setdefault(key, {})[m.step] = m.value
    return out


def _weights(client: MlflowClient, run_id: str, tmp: Path) -> dict[str, torch.Tensor]:
    folder = Path(client.download_artifacts(run_id, "model", str(tmp)))
    return load_file(str(next(folder.glob("*.safetensors"))))


# regime, the fit stopped in (1-based), the step it is stopped at (after a validation of that fit), loader workers
CASES = [
    ("pretrain", 1, 4, 0),
    ("pretrain", 1, 4, 2),  # resumed at step 3: the next batch is the second worker's
    ("distill", 1, 4, 0),
    ("prune", 3, 4, 0),  # the second round's gates
    ("quant", 1, 4, 0),  # QAT
    ("finetune", 1, 5, 0),  # fine-tuning, after its first validation
    ("finetune", 3, 4, 0),  # QAT, after the fine-tuning and the exits ended
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("regime", "fit", "step", "workers"), CASES)
def test_a_run_stopped_mid_phase_resumes_and_ends_as_an_uninterrupted_one(source, tmp_path, regime, fit, step, workers):
    base, src = source
    tree = _tree(base, regime, src)
    tree["data"]["num_workers"] = workers
    tree["tracking"]["experiment"] = f"resume-{regime}-{fit}-{workers}"  # the source's store, an experiment of its own
    cfg = build_config(tree)
    assert len(runner.plan(cfg).phases) >= fit
    plan = checkpoints.run_place(str(tmp_path / "ckpt"), cfg.tracking.root, cfg)

    straight = train(cfg, RunContext(checkpoint=plan))
    with pytest.raises(Interrupted):
        train(cfg, RunContext(checkpoint=plan, callbacks=(StopIn(fit, step),)))
    client = MlflowClient(straight.tracking_uri)
    killed = client.search_runs(
        [client.get_run(straight.run_id).info.experiment_id], filter_string="attributes.status = 'KILLED'"
    )[0]
    resumed = train(cfg, RunContext(checkpoint=plan, resume=True, reopen=killed.info.run_id))

    assert resumed.run_id == killed.info.run_id
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[RESUMED]
    want, got = _history(client, straight.run_id), _history(client, resumed.run_id)
    for key in got:  # the points the uninterrupted run has: nothing logged past the checkpoint is kept twice
        points = [sorted(m.step for m in client.get_metric_history(r, key)) for r in (straight.run_id, resumed.run_id)]
        assert points[1] == points[0], key
    assert set(got) == set(want)
    for key in want:
        assert set(got[key]) == set(want[key]), key  # the same steps
        for s, value in want[key].items():
            assert got[key][s] == pytest.approx(value, rel=1e-5, abs=1e-6), (key, s)
    a, b = _weights(client, straight.run_id, tmp_path / "a"), _weights(client, resumed.run_id, tmp_path / "b")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)
