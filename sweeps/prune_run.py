"""One pruning run (``prune.source`` set): schuBERT's rounds, or a baseline, as one MLflow run.

schuBERT (``prune.method: schubert-*``), for T rounds: train gates for R steps on the frozen
model (:class:`~lightning_modules.prune.PruneModule`); zero the smallest gates until the
round's share of the parameters to remove is gone; remove those rows and columns for real
(the module and its config shrink); fine-tune all weights for F steps with the
pre-training loss. The baselines reach the target at once (``uniform``: every dimension
shrunk by one factor, largest-norm units kept; ``fewer-layers``: the first L' layers) and
fine-tune for T x F steps, the same budget.

The run logs the parameter count after each round (``prune/params``), latency and FLOPs
before (``source/...``) and after, the per-layer dimension table (``dims.md``/``dims.csv``)
and the pruned model as its ``model/`` artifacts, whose ``config.yaml`` (per-layer
``model.layers``) ``ablate train`` can also train from scratch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import lightning.pytorch as pl
import pandas as pd
from lightning.pytorch.loggers import MLFlowLogger
from rich.console import Console

from ablate.datamodules.pretrain import PretrainDataModule
from ablate.lightning_modules.accounting import metric_counts
from ablate.lightning_modules.config import ExperimentConfig, ModelConfig, ObjectiveConfig
from ablate.lightning_modules.errors import ConfigError
from ablate.lightning_modules.heads import PretrainingModel, build_pretraining_model
from ablate.lightning_modules.pretrain import PretrainModule
from ablate.lightning_modules.prune import PruneModule
from ablate.lightning_modules.pruning.budget import backbone_params, choose, fewer_layers, magnitude_keep, uniform
from ablate.lightning_modules.pruning.keep import VARIANTS
from ablate.lightning_modules.pruning.surgery import shrink
from ablate.sweeps.trainer import ValidateAtEnd, build_trainer, fit
from ablate.sweeps.weights import Source, log_weights

_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)


class _PhaseLogger(MLFlowLogger):
    """One MLflow run across several fits: steps continue from ``offset``; the run is ended by us."""

    offset = 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, (step or 0) + self.offset)

    def finalize(self, status: str = "success") -> None:  # Lightning would end the run after each fit
        pass


def _fit(
    module: pl.LightningModule, cfg: ExperimentConfig, steps: int, data: PretrainDataModule, logger: _PhaseLogger
) -> dict[str, float]:
    """Train ``module`` for ``steps`` steps (validating at the end) and move the step offset on."""
    metrics = fit(build_trainer(cfg, logger, [ValidateAtEnd()], max_steps=steps), module, data)
    logger.offset += steps
    return metrics


def _with_model(cfg: ExperimentConfig, model_cfg: ModelConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, model=model_cfg)


def first_layers(model: PretrainingModel, new_cfg: ModelConfig, objective: ObjectiveConfig) -> PretrainingModel:
    """The first ``new_cfg.num_layers`` layers of ``model`` (with its embeddings and heads)."""
    small = build_pretraining_model(new_cfg, objective)
    keep = {f"encoder.{kind}.{i}." for kind in ("attentions", "ffn_stacks") for i in range(new_cfg.num_layers)}
    state = {
        k: v
        for k, v in model.state_dict().items()
        if not k.startswith(("encoder.attentions.", "encoder.ffn_stacks.")) or any(k.startswith(p) for p in keep)
    }
    if small.sentence_head is None:
        state = {k: v for k, v in state.items() if not k.startswith("sentence_head.")}
    missing, _ = small.load_state_dict(state, strict=False)
    if any(not k.startswith("sentence_head.") for k in missing):  # only a sentence head may start fresh
        raise ConfigError(f"prune.source: its weights do not fit {new_cfg.num_layers} layers ({missing[:3]})")
    return small


def dims_table(cfg: ModelConfig) -> pd.DataFrame:
    """The per-layer dimensions (the paper's table of optimized architectures)."""
    rows = [
        {"layer": i + 1, "heads a": s.num_heads, "qk k": s.qk_dim, "value v": s.v_dim, "ffn f": s.ffn_dim}
        for i, s in enumerate(cfg.layer_specs())
    ]
    frame = pd.DataFrame(rows)
    frame.attrs["hidden h"] = cfg.hidden_dim
    return frame


def run_pruning(
    cfg: ExperimentConfig,
    data: PretrainDataModule,
    uri: str,
    client: Any,
    run_id: str,
    source_cfg: ModelConfig,
    model: PretrainingModel,
) -> tuple[ModelConfig, PretrainingModel, dict[str, float]]:
    """The rounds (or the baseline) on ``model``; returns the pruned config, model and last metrics."""
    p = cfg.prune
    logger = _PhaseLogger(tracking_uri=uri, run_id=run_id, log_model=False)
    start = backbone_params(source_cfg)
    eta = p.target_params(start)
    cur_cfg, metrics = source_cfg, {}
    client.log_metric(run_id, "prune/params", start, step=0)
    if p.method in VARIANTS:
        for r in range(p.rounds):
            gate = PruneModule(_with_model(cfg, cur_cfg), model, VARIANTS[p.method])
            _fit(gate, cfg, p.gate_steps, data, logger)
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
            client.log_metric(run_id, "prune/params", now, step=logger.offset)
            short = "" if now <= plan else f"; {p.method} cannot remove more (one unit of each gated dimension stays)"
            _CONSOLE.print(
                f"prune round {r + 1}/{p.rounds}: {now / 1e6:.3f}M backbone parameters "
                f"(plan {plan / 1e6:.3f}M, target {eta / 1e6:.3f}M){short}",
                markup=False,
            )
            if p.finetune_steps:
                metrics = _fit(PretrainModule(_with_model(cfg, cur_cfg), model), cfg, p.finetune_steps, data, logger)
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
        client.log_metric(run_id, "prune/params", now, step=0)
        _CONSOLE.print(
            f"prune {p.method}: {now / 1e6:.3f}M backbone parameters (target {eta / 1e6:.3f}M)", markup=False
        )
        steps = p.rounds * p.finetune_steps
        if steps:
            metrics = _fit(PretrainModule(_with_model(cfg, cur_cfg), model), cfg, steps, data, logger)
    return cur_cfg, model, metrics


def prune_train(
    cfg: ExperimentConfig, source: Source, data: PretrainDataModule, uri: str, client: Any, run_id: str
) -> dict[str, float]:
    """Prune ``source`` as ``cfg.prune`` says inside run ``run_id``, log the outcome; the last metrics."""
    before, _ = metric_counts(source.model, source.model_cfg, cfg)  # on the training device, as the run's own
    for key, value in before.items():
        client.log_metric(run_id, f"source/{key}", float(value))
    new_cfg, model, metrics = run_pruning(cfg, data, uri, client, run_id, source.model_cfg, source.model)
    final = _with_model(cfg, new_cfg)
    after, measured_on = metric_counts(model, new_cfg, final)
    for key, value in after.items():
        client.log_metric(run_id, key, float(value))
    for key, value in measured_on.items():
        client.log_param(run_id, key, value)
    table = dims_table(new_cfg)
    markdown = ["| " + " | ".join(table.columns) + " |", "|" + "---:|" * len(table.columns)]
    markdown += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    client.log_text(run_id, f"hidden h = {new_cfg.hidden_dim}\n\n" + "\n".join(markdown) + "\n", "dims.md")
    client.log_text(run_id, table.assign(hidden=new_cfg.hidden_dim).to_csv(index=False), "dims.csv")
    layers = " ".join(f"{s.num_heads}/{s.qk_dim}/{s.v_dim}/{s.ffn_dim}" for s in new_cfg.layer_specs())
    client.set_tag(run_id, "ablate.pruned_layers", layers)
    # the shape found, as a param a report can show beside the metrics: "h=96 a/k/v/f per layer"
    client.log_param(run_id, "pruned.dims", f"h={new_cfg.hidden_dim} {layers}")
    log_weights(client, run_id, model, final)
    return metrics
