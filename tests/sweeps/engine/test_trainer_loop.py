"""What every training loop gets: the NaN guard reads the device only at its checks, one check late, and names
the first bad step; bf16 with gradient clipping trains with the fused AdamW."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from ablate.lightning_modules.config.experiment import to_dict
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.trainer import FiniteLoss


def test_a_check_that_does_not_wait_answers_at_the_next_check():
    guard = FiniteLoss(every=2)
    guard.update(torch.tensor(1.0), 0)
    guard.update(torch.tensor(float("nan")), 1)
    guard.check(wait=False)  # asked, not read
    assert guard._kept == [] and guard._asked is not None
    guard.update(torch.tensor(1.0), 2)
    with pytest.raises(FloatingPointError, match=r"training loss became nan at step 1$"):
        guard.check(wait=False)  # the answer to the check before


def test_the_guard_names_the_first_non_finite_step_only_when_it_checks():
    guard = FiniteLoss(every=10)
    for step, loss in enumerate([2.0, 1.5, float("nan"), float("inf"), 1.0]):
        guard.update(torch.tensor(loss), step)
    assert len(guard._kept) == 5  # kept on the device, nothing read yet
    with pytest.raises(FloatingPointError, match=r"training loss became nan at step 2$"):
        guard.check()
    fine = FiniteLoss(every=10)
    for step in range(5):
        fine.update(torch.tensor(1.0), step)
    fine.check()  # finite throughout: no error
    assert fine._kept == []  # what was checked is let go
    fine.update(torch.tensor(float("inf")), 5)
    with pytest.raises(FloatingPointError, match=r"became inf at step 5$"):
        fine.check()  # a later bad step, after a clean check


def _cfg(tmp_path: Path, corpus: Path, **trainer: object):
    return build_config(
        {
            "model": {"preset": "albert-tiny", "vocab_size": 2048},
            "data": {"corpus": str(corpus), "max_length": 64, "batch_size": 8, "num_workers": 0},
            "trainer": {
                "max_steps": 12,
                "val_every": 6,
                "val_batches": 2,
                "progress": False,
                "measure": False,
                **trainer,
            },
            "tracking": {"root": str(tmp_path / "runs")},
        }
    )


def test_bf16_with_gradient_clipping_trains_with_the_fused_optimizer(tmp_path, wiki_validation):
    """Lightning's mixed-precision plugin refuses to clip for a fused optimizer; the modules clip
    themselves where no scaler is involved (bf16), so bf16 runs keep ``optim.grad_clip``."""
    cfg = _cfg(tmp_path, wiki_validation, precision="bf16-mixed")
    assert cfg.optim.grad_clip > 0
    result = train(cfg, RunContext(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert torch.isfinite(torch.tensor(result.metrics["val/loss"]))


def test_a_loss_that_turns_nan_fails_the_run_at_that_step(tmp_path, wiki_validation):
    cfg = _cfg(tmp_path, wiki_validation, log_every=5)
    cfg = build_config({**to_dict(cfg), "optim": {"lr": 1.0e9, "warmup_steps": 1, "grad_clip": 0.0}})
    with pytest.raises(FloatingPointError, match=r"training loss became .* at step (\d+)") as err:
        train(cfg, RunContext(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert int(err.value.args[0].rsplit("step ", 1)[1]) < 12


class _PoisonAt(pl.Callback):
    """From step ``step`` on, the model's weights are NaN: every loss from that step is NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                for p in pl_module.parameters():
                    p.fill_(float("nan"))


def test_the_guard_checks_every_log_every_steps_and_names_the_first_bad_step(tmp_path, wiki_validation):
    """NaN from step 7 on (trainer.log_every = 2): the check after step 7 asks about steps 6 and 7 without
    waiting for the device, the next one (after step 9) reads the answer; the error names step 7, not the
    step at which it was read, and the run ends FAILED."""
    import mlflow

    cfg = _cfg(tmp_path, wiki_validation, log_every=2, max_steps=12, val_every=12)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    seen: list[int] = []

    class Steps(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(trainer.global_step)

    with pytest.raises(FloatingPointError, match=r"training loss became nan at step 7$"):
        train(cfg, RunContext(tracking_uri=uri, callbacks=(_PoisonAt(7), Steps())))
    assert seen[-1] == 9  # trained on past the bad step until the guard's read, one check later
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
