"""schuBERT's pruning as one algorithm, given a way to train (the caller's Lightning fit).

schuBERT (``prune.method: schubert-*``), for T rounds: train gates for R steps on the frozen
model (:class:`~ablate.lightning_modules.methods.prune.PruneModule`); zero the smallest gates until the
round's share of the parameters to remove is gone; remove those rows and columns for real
(:func:`~ablate.lightning_modules.methods.pruning.surgery.shrink`: the module and its config shrink);
fine-tune all weights for F steps with the pre-training loss. The baselines reach the target
at once (``uniform``: every dimension shrunk by one factor, largest-norm units kept;
``fewer-layers``: the first L' layers) and fine-tune for T x F steps, the same budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import lightning.pytorch as pl
import pandas as pd
from rich.console import Console

from ablate.lightning_modules.config.experiment import ExperimentConfig, ModelConfig
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.prune import PruneModule
from ablate.lightning_modules.methods.pruning.budget import (
    backbone_params,
    choose,
    fewer_layers,
    magnitude_keep,
    uniform,
)
from ablate.lightning_modules.methods.pruning.keep import VARIANTS
from ablate.lightning_modules.methods.pruning.surgery import first_layers, shrink
from ablate.lightning_modules.model.heads import PretrainingModel

Fit = Callable[[pl.LightningModule, int], dict[str, float]]
"""Train a module for a number of steps (validating at the end); its final metrics."""

_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)


def _with_model(cfg: ExperimentConfig, model_cfg: ModelConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, model=model_cfg)


def dims_table(cfg: ModelConfig) -> pd.DataFrame:
    """The per-layer dimensions (the paper's table of optimized architectures)."""
    rows = [
        {"layer": i + 1, "heads a": s.num_heads, "qk k": s.qk_dim, "value v": s.v_dim, "ffn f": s.ffn_dim}
        for i, s in enumerate(cfg.layer_specs())
    ]
    frame = pd.DataFrame(rows)
    frame.attrs["hidden h"] = cfg.hidden_dim
    return frame


def dims_markdown(table: pd.DataFrame) -> str:
    """:func:`dims_table` as a Markdown table, under the hidden size."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---:|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return f"hidden h = {table.attrs['hidden h']}\n\n" + "\n".join(lines) + "\n"


def prune(
    cfg: ExperimentConfig,
    source_cfg: ModelConfig,
    model: PretrainingModel,
    fit: Fit,
    record: Callable[[int], None],
) -> tuple[ModelConfig, PretrainingModel, dict[str, float]]:
    """Prune ``model`` (of shape ``source_cfg``) as ``cfg.prune`` says.

    Args:
        cfg: the run's config (``prune.*``, and the trainer and optimiser of each phase).
        source_cfg: the trained model's shape.
        model: the trained model (left unchanged; the pruned one is a new module).
        fit: trains a phase's module for some steps (gates, then fine-tuning).
        record: called with the backbone parameter count at the start and after each round.

    Returns:
        The pruned shape, the pruned model and the last fine-tuning phase's metrics.
    """
    p = cfg.prune
    start = backbone_params(source_cfg)
    eta = p.target_params(start)
    cur_cfg, metrics = source_cfg, {}
    record(start)
    if p.method in VARIANTS:
        for r in range(p.rounds):
            gate = PruneModule(_with_model(cfg, cur_cfg), model, VARIANTS[p.method])
            fit(gate, p.gate_steps)
            plan = round(start - (r + 1) * (start - eta) / p.rounds)
            keep = choose(
                cur_cfg,
                {d: [g.detach() for g in v] for d, v in gate.gates.vectors().items()},
                backbone_params(cur_cfg) - plan,
            )
            gate.gates.zero_except(keep)  # the smallest gates to exactly zero
            model = gate.release()
            cur_cfg, model = shrink(model, cur_cfg, keep, gate.gates)  # removes them, folds the others in
            now = backbone_params(cur_cfg)
            record(now)
            short = "" if now <= plan else f"; {p.method} cannot remove more (one unit of each gated dimension stays)"
            _CONSOLE.print(
                f"prune round {r + 1}/{p.rounds}: {now / 1e6:.3f}M backbone parameters "
                f"(plan {plan / 1e6:.3f}M, target {eta / 1e6:.3f}M){short}",
                markup=False,
            )
            if p.finetune_steps:
                metrics = fit(PretrainModule(_with_model(cfg, cur_cfg), model), p.finetune_steps)
    else:
        shapes = {"uniform": uniform, "fewer-layers": fewer_layers}
        new_cfg = shapes[p.method](source_cfg, eta)
        model = (
            first_layers(model, new_cfg, cfg.objective)
            if p.method == "fewer-layers"
            else shrink(model, source_cfg, magnitude_keep(model, source_cfg, new_cfg))[1]
        )
        cur_cfg = new_cfg
        now = backbone_params(cur_cfg)
        record(now)
        _CONSOLE.print(
            f"prune {p.method}: {now / 1e6:.3f}M backbone parameters (target {eta / 1e6:.3f}M)", markup=False
        )
        steps = p.rounds * p.finetune_steps
        if steps:
            metrics = fit(PretrainModule(_with_model(cfg, cur_cfg), model), steps)
    return cur_cfg, model, metrics
