"""``ablate bench pruning``: the wall time Optuna pruning saves on a 12-trial study (the same grid run
with and without a PercentilePruner; target: 40% saved, the same best configuration), and replays of
the unpruned curves in other grid orders (docs/performance.md, "Sweeps")."""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from rich.progress import Progress

from ablate.benchmarks import mark
from ablate.lightning_modules.config.yamlio import Json

TARGET_SAVED = 0.40


def study(corpus: str, root: Path, name: str, pruner: dict[str, Json], steps: int) -> dict[str, Json]:
    """The 12-trial benchmark study (grid: lr 3 x E 2 x sharing 2)."""
    return {
        "name": name,
        "base": {
            "model": {"preset": "albert-tiny"},
            "objective": {"sentence": "sop"},
            "data": {"corpus": corpus, "max_length": 64, "batch_size": 32, "tokenizer_docs": 5000},
            "optim": {"warmup_steps": 20},
            "trainer": {
                "max_steps": steps,
                "val_every": steps // 6,
                "val_batches": 4,
                "measure": False,
                "progress": False,
            },
            "tracking": {"root": str(root)},
        },
        "search": {
            "optim.lr": {"choices": [1.0e-4, 1.0e-3, 3.0e-3]},
            "model.embed_dim": {"choices": [32, 128]},
            "model.sharing": {"choices": ["all", "none"]},
        },
        "seeds": [0],
        "sampler": "grid",
        "pruner": pruner,
        "optimize": {"metric": "val/loss", "direction": "minimize"},
    }


def timed_study(raw: dict[str, Json], folder: Path) -> tuple[float, optuna.Study]:
    """Run a study; its wall time and the finished study."""
    from ablate.sweeps.spec import load_study
    from ablate.sweeps.study import run_study

    path = folder / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    spec, base = load_study(path)
    start = time.perf_counter()
    result = run_study(spec, base)
    return time.perf_counter() - start, result.study


def states(study: optuna.Study) -> dict[str, int]:
    """How many trials ended in each state."""
    return dict(Counter(trial.state.name for trial in study.trials))


def replay(complete: optuna.Study, pruner: optuna.pruners.BasePruner, order: list[int]) -> tuple[float, bool, float]:
    """Replay the curves of an unpruned study through ``pruner``, trials in ``order``: the share of
    training steps pruning would have saved, whether it keeps the same best trial, and how much
    worse the best it keeps is (objective units, 0 when it keeps the best)."""
    trials = complete.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    replayed = optuna.create_study(direction=complete.direction, pruner=pruner)
    spent = total = 0
    for index in order:
        source, trial = trials[index], replayed.ask()
        curve = sorted(source.intermediate_values.items())
        total += curve[-1][0]
        for step, value in curve:
            trial.report(value, step)
            if trial.should_prune():
                replayed.tell(trial, state=optuna.trial.TrialState.PRUNED)
                spent += step
                break
        else:
            trial.set_user_attr("source", index)
            replayed.tell(trial, source.value)
            spent += curve[-1][0]
    kept = replayed.best_trial.user_attrs["source"] == trials.index(complete.best_trial)
    return 1 - spent / total, kept, abs(replayed.best_value - complete.best_value)


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    steps = args.steps or 300
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    arms: dict[str, dict[str, Json]] = {
        "no pruning": {"type": "none"},
        "percentile pruner": {
            "type": "percentile",
            "percentile": 25.0,
            "n_startup_trials": 2,
            "n_warmup_steps": steps // 6,
        },
    }
    out = {}
    with tempfile.TemporaryDirectory(prefix="ablate-bench-") as tmp:
        for i, (label, pruner) in enumerate(arms.items()):
            task = progress.add_task(f"12-trial study, {label}", total=None)
            folder = Path(tmp) / f"arm{i}"
            folder.mkdir()
            # one study name for both arms (separate stores): the same seeded grid order
            out[label] = timed_study(study(args.corpus, folder / "runs", "bench-pruning", pruner, steps), folder)
            progress.remove_task(task)
    (t_none, plain), (t_pruned, pruned) = out["no pruning"], out["percentile pruner"]
    saved = 1 - t_pruned / t_none
    same = plain.best_trial.params == pruned.best_trial.params
    lines = [
        f"### Sweep efficiency: 12 trials (lr x E x sharing), tiny ALBERT, {steps} steps each ({args.corpus})",
        "",
        "| study | wall time | trials | best configuration |",
        "|---|---:|---|---|",
        f"| no pruning | {t_none:,.0f} s | {states(plain)} | {_params(plain)} |",
        f"| percentile pruner (25th, from step {steps // 6}) | {t_pruned:,.0f} s | {states(pruned)} | "
        f"{_params(pruned)} |",
        "",
        f"- wall time saved: **{saved:.0%}** (target {TARGET_SAVED:.0%}: {mark(saved >= TARGET_SAVED)})",
        f"- same best configuration: {'yes' if same else 'NO'}",
        "",
    ]
    lines += _robustness(plain, arms["percentile pruner"], steps)
    return lines, saved >= TARGET_SAVED and same


def _params(study: optuna.Study) -> str:
    return ", ".join(f"{k}={v}" for k, v in study.best_trial.params.items() if k != "seed")


def _robustness(plain: optuna.Study, pruner: dict[str, Json], steps: int, orders: int = 50) -> list[str]:
    """Replays of the unpruned curves in other grid orders and from other start steps."""
    from ablate.sweeps.optuna_spec import PrunerSpec

    complete = plain.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    curves = optuna.create_study(direction=plain.direction)  # in memory: the replays read it 150 times
    curves.add_trials(complete)
    rng = random.Random(0)
    n = len(complete)
    shuffles = [rng.sample(range(n), n) for _ in range(orders)]
    lines = [
        f"Replaying the unpruned study's validation curves through the pruner in {orders} random grid "
        "orders (training steps saved, not wall time: each trial's fixed start-up cost is not in it):",
        "",
        "| pruner starts at step | steps saved, median (min-max) | keeps the best | else its best is worse by, "
        "median (max) |",
        "|---:|---|---:|---|",
    ]
    for start in (steps // 6, steps // 3, steps // 2):
        fields: dict[str, Any] = {**pruner, "n_warmup_steps": start}  # validated by PrunerSpec
        spec = PrunerSpec(**fields)
        runs = [replay(curves, spec.build(steps), order) for order in shuffles]
        saved = sorted(r[0] for r in runs)
        gaps = sorted(r[2] for r in runs if not r[1]) or [0.0]
        lines.append(
            f"| {start} | {statistics.median(saved):.0%} ({saved[0]:.0%}-{saved[-1]:.0%}) | "
            f"{sum(r[1] for r in runs)}/{orders} | {statistics.median(gaps):.4f} ({gaps[-1]:.4f}) |"
        )
    best, second = sorted(t.value for t in complete if t.value is not None)[:2]  # a COMPLETE trial has one
    return lines + [
        "",
        f"The unpruned study's two best configurations end {abs(second - best):.4f} apart: a pruner "
        "that misses the best mostly keeps the runner-up.",
        "",
    ]
