"""The figures the benchmarks derive without timing: a step's FLOPs (forward + backward) and
the replay of an unpruned study's curves through a pruner."""

from __future__ import annotations

import optuna
import torch

from ablate.benchmarks.ceiling import Ceiling, step_flops
from ablate.benchmarks.sweep_pruning import replay
from ablate.benchmarks.train_speed import Side


def test_step_flops_counts_forward_and_backward() -> None:
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 64)
    side = Side(
        "linear",
        "ablate",
        "fp32",
        step=lambda b: 0.0,
        loss_only=lambda b: layer(b["x"]).sum(),
        params=list(layer.parameters()),
    )
    # forward x @ W^T, backward grad_W only (x needs no grad): 2 matmuls of 2 * 8 * 64 * 32
    assert step_flops(side, {"x": x}) == 2 * (2 * 8 * 64 * 32)
    assert layer.weight.grad is None  # gradients are cleared for the timed steps
    assert Ceiling(flops=4e9, peak=2e11).min_step_s == 0.02


def _unpruned(curves: list[list[float]]) -> optuna.Study:
    """A finished study without pruning: one trial per curve, reported at steps 10, 20, ..."""
    study = optuna.create_study(direction="minimize")
    for curve in curves:
        trial = study.ask()
        for i, value in enumerate(curve):
            trial.report(value, 10 * (i + 1))
        study.tell(trial, curve[-1])
    return study


def test_replay_saves_steps_of_pruned_trials_and_tells_whether_the_best_survives() -> None:
    # trial 2 leads trial 0 until trial 0 overtakes it at the last step; 1 and 3 are worse throughout
    curves = [[5.0, 4.0, 3.0, 2.0], [9.0, 9.0, 9.0, 9.0], [4.5, 3.9, 2.9, 2.1], [8.0, 8.0, 8.0, 8.0]]
    plain = _unpruned(curves)
    assert replay(plain, optuna.pruners.NopPruner(), [0, 1, 2, 3]) == (0.0, True, 0.0)

    # trial 0 completes first; 1 and 3 are worse than it at step 10 and stop there; 2 runs on
    saved, kept, gap = replay(plain, optuna.pruners.MedianPruner(n_startup_trials=1), [0, 1, 2, 3])
    assert kept and gap == 0.0
    assert saved == 1 - (40 + 10 + 40 + 10) / 160

    # trial 2 first: trial 0 is worse than it at step 10 and is pruned, so the study ends on 2.1
    saved, kept, gap = replay(plain, optuna.pruners.MedianPruner(n_startup_trials=1), [2, 0, 1, 3])
    assert not kept and abs(gap - 0.1) < 1e-12
    assert saved == 1 - (40 + 10 + 10 + 10) / 160
