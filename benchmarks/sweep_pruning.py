"""``ablate bench pruning``: the wall time Optuna pruning saves on a 12-trial study.

The same 12-configuration grid (learning rate x E x sharing, tiny ALBERT) runs twice into a
temporary folder, once without pruning and once with Optuna's PercentilePruner (a trial
worse than the best quarter of the earlier ones at the same step stops) on the validation loss; the two wall times and best configurations are compared (target: at least 40% saved,
the same best configuration).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.progress import Progress

TARGET_SAVED = 0.40


def study(corpus: str, root: Path, name: str, pruner: dict[str, Any], steps: int) -> dict[str, Any]:
    """The 12-trial benchmark study (grid: lr 3 x E 2 x sharing 2)."""
    return {
        "name": name,
        "base": {
            "model": {"preset": "albert-tiny"},
            "objective": {"sentence": "sop"},
            "data": {"corpus": corpus, "max_length": 64, "batch_size": 32, "tokenizer_docs": 5000},
            "optim": {"warmup_steps": 20},
            "trainer": {"max_steps": steps, "val_every": steps // 6, "val_batches": 4, "measure": False,
                        "progress": False},
            "tracking": {"root": str(root)},
        },
        "search": {"optim.lr": {"choices": [1.0e-4, 1.0e-3, 3.0e-3]}, "model.embed_dim": {"choices": [32, 128]},
                   "model.sharing": {"choices": ["all", "none"]}},
        "seeds": [0],
        "sampler": "grid",
        "pruner": pruner,
        "objective": {"metric": "val/loss", "direction": "minimize"},
    }


def timed_study(raw: dict[str, Any], folder: Path) -> tuple[float, dict[str, Any], dict[str, int]]:
    """Run a study; its wall time, best params and trial states."""
    from sweeps.spec import load_study
    from sweeps.study import run_study

    path = folder / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    spec, base = load_study(path)
    start = time.perf_counter()
    result = run_study(spec, base)
    elapsed = time.perf_counter() - start
    states: dict[str, int] = {}
    for trial in result.study.trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return elapsed, result.study.best_trial.params, states


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    steps = args.steps or 300
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    arms = {"no pruning": {"type": "none"},
            "percentile pruner": {"type": "percentile", "percentile": 25.0, "n_startup_trials": 2,
                                  "n_warmup_steps": steps // 3}}
    out = {}
    with tempfile.TemporaryDirectory(prefix="ablate-bench-") as tmp:
        for i, (label, pruner) in enumerate(arms.items()):
            task = progress.add_task(f"12-trial study, {label}", total=None)
            folder = Path(tmp) / f"arm{i}"
            folder.mkdir()
            # one study name for both arms (separate stores): the same seeded grid order
            out[label] = timed_study(study(args.corpus, folder / "runs", "bench-pruning", pruner, steps), folder)
            progress.remove_task(task)
    (t_none, best_none, _), (t_pruned, best_pruned, states) = out["no pruning"], out["percentile pruner"]
    saved = 1 - t_pruned / t_none
    same = best_none == best_pruned
    lines = [f"### Sweep efficiency: 12 trials (lr x E x sharing), tiny ALBERT, {steps} steps each ({args.corpus})",
             "", "| study | wall time | trials | best configuration |", "|---|---:|---|---|",
             f"| no pruning | {t_none:,.0f} s | 12 complete | {best_none} |",
             f"| percentile pruner (25th, from step {steps // 3}) | {t_pruned:,.0f} s | {states} | {best_pruned} |", "",
             f"- wall time saved: **{saved:.0%}** (target {TARGET_SAVED:.0%}: {'ok' if saved >= TARGET_SAVED else 'MISSED'})",
             f"- same best configuration: {'yes' if same else 'NO'}", ""]
    return lines, saved >= TARGET_SAVED and same
