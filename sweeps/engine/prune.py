"""A pruning run (``prune.source`` set) as a list of phases: :func:`prune_plan` (schuBERT's rounds, each a gate
phase cut when it ends and a re-training phase, or a baseline's one cut and its re-training; then the pruned
shape and the quantized model) and :func:`prepare_prune`. What the run logs: docs/guides/pruning.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import lightning.pytorch as pl

from ablate.datamodules.pretrain import PretrainDataModule
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.measure.cache import cached_counts
from ablate.lightning_modules.methods.prune import PruneModule
from ablate.lightning_modules.methods.pruning.budget import backbone_params
from ablate.lightning_modules.methods.pruning.gates import check_supported
from ablate.lightning_modules.methods.pruning.schubert import Pruned, Pruning, dims_markdown, dims_table
from ablate.lightning_modules.methods.train_module import OptimSetup
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepared, RunContext
from ablate.sweeps.engine.inputs import checked_source, corpus, tokenizer_of
from ablate.sweeps.engine.phases import Finisher, Leaving, Metrics, Phase, RunPlan
from ablate.sweeps.engine.quant import quantize_and_log
from ablate.sweeps.engine.sources import Source


@dataclass(frozen=True)
class PruneRun:
    """A pruning run's materials: the pruning (its config, start and target) and the corpus; what its phases
    hand on is the model as pruned so far (:class:`Pruned`)."""

    pruning: Pruning
    data: PretrainDataModule

    def config(self, now: Pruned) -> ExperimentConfig:
        """The run's config with the shape ``now``."""
        return dataclasses.replace(self.pruning.cfg, model=now.shape)

    def leaving(self, handed: Pruned) -> Leaving:
        return handed.model, self.config(handed), None


def _gates(m: PruneRun, now: Pruned, run: ActiveRun) -> tuple[pl.LightningModule, Pruned]:
    return m.pruning.gates(now), now


def _cut(round_: int) -> Callable[[PruneRun, Pruned, pl.LightningModule, Metrics], tuple[Pruned, Metrics]]:
    """When round ``round_``'s gates have trained: the cut model, and the parameters left (logged there)."""

    def cut(m: PruneRun, now: Pruned, module: pl.LightningModule, metrics: Metrics) -> tuple[Pruned, Metrics]:
        assert isinstance(module, PruneModule)
        pruned = m.pruning.cut(now, module, round_)
        return pruned, {"prune/params": float(backbone_params(pruned.shape))}

    return cut


def _retraining(m: PruneRun, now: Pruned, run: ActiveRun) -> tuple[pl.LightningModule, Pruned]:
    return m.pruning.retraining(now), now


def _shape(m: PruneRun, now: Pruned, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """The pruned shape: its counts and latency, the per-layer table, the layers as a tag and a param."""
    cfg = m.config(now)
    new_cfg = now.shape
    after, measured_on = cached_counts(now.model, new_cfg, cfg)
    run.log({key: float(value) for key, value in after.items()}, step=step)
    logged = run.client.get_run(run.run_id).data.params  # a retry's run has them (params cannot change)
    for key, value in measured_on.items():
        if key not in logged:
            run.client.log_param(run.run_id, key, value)
    table = dims_table(new_cfg)
    run.text(dims_markdown(table), "dims.md")
    run.text(table.assign(hidden=new_cfg.hidden_dim).to_csv(index=False), "dims.csv")
    layers = " ".join(f"{s.num_heads}/{s.qk_dim}/{s.v_dim}/{s.ffn_dim}" for s in new_cfg.layer_specs())
    run.tag("ablate.pruned_layers", layers)
    # the shape found, as a param a report can show beside the metrics: "h=96 a/k/v/f per layer"
    run.client.log_param(run.run_id, "pruned.dims", f"h={new_cfg.hidden_dim} {layers}")
    return {}


def _quantized(m: PruneRun, now: Pruned, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """The pruned model, quantized."""
    return quantize_and_log(now.model, m.config(now), m.data, run, step, metrics)


def prune_plan(cfg: ExperimentConfig) -> RunPlan[PruneRun, Pruned]:
    """schuBERT: ``prune.rounds`` x (gates for ``prune.gate_steps``, cut; re-training for
    ``prune.finetune_steps``); a baseline: one cut, re-training for rounds x finetune_steps. Then the
    pruned shape and the quantized model (``quant.method``)."""
    p = cfg.prune
    optim = OptimSetup.pretraining(cfg, cfg.trainer.max_steps).describe()  # the re-training module's
    phases: list[Phase[PruneRun, Pruned]] = []
    if p.method.startswith("schubert"):  # the gated methods (VARIANTS of methods/pruning/keep.py)
        for r in range(p.rounds):
            at = f"{r + 1}/{p.rounds}"
            how, gates = "new module (gates on the frozen model)", f"Adam over the gates, lr {p.gate_lr:g}"
            phases.append(Phase(f"gates {at}", p.gate_steps, _gates, how, p.method, optim=gates, ended=_cut(r)))
            if p.finetune_steps:
                phases.append(
                    Phase(f"re-training {at}", p.finetune_steps, _retraining, "new module (the cut model)", optim=optim)
                )
    elif p.rounds * p.finetune_steps:
        how = f"new module ({p.method}: cut at once)"
        phases.append(Phase("re-training", p.rounds * p.finetune_steps, _retraining, how, optim=optim))
    shape = "counts, latency and the per-layer table of the pruned model"
    finishers = [Finisher[PruneRun, Pruned]("pruned shape", shape, _shape)]
    if cfg.quant.enabled:
        finishers.append(
            Finisher("quantize and score", f"{cfg.quant.method}, held-out MLM metrics on the CPU", _quantized)
        )
    return RunPlan(phases, finishers)


def _begin(pruning: Pruning, source: Source, first: Pruned, ctx: RunContext) -> Callable[[ActiveRun, bool], None]:
    """What the run logs first, at step 0 (not again when it goes on): the source's counts and its
    parameters, then a baseline's after its cut (``first``: what its re-training starts from)."""

    def begin(run: ActiveRun, going_on: bool) -> None:
        if going_on:
            return
        before, _ = ctx.measure(cached_counts, source.model, source.model_cfg, pruning.cfg)  # training device
        run.log({f"source/{key}": float(value) for key, value in before.items()})
        run.log({"prune/params": float(pruning.start)})
        if not pruning.gated:
            run.log({"prune/params": float(backbone_params(first.shape))})

    return begin


def prepare_prune(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared[PruneRun, Pruned]:
    """Pruning ``prune.source`` as ``prune.method`` says; a baseline (``uniform``, ``fewer-layers``) is cut to the
    target here, before the run exists."""
    data = corpus(cfg)
    tokenizer = tokenizer_of(data)
    source = checked_source(cfg, cfg.prune.source, "prune.source", uri, tokenizer)  # type: ignore[arg-type]
    try:  # a source that layer surgery cannot shrink (shared layers ...) fails before the run exists
        if cfg.prune.method != "fewer-layers":  # which only drops whole layers
            check_supported(source.model_cfg)
    except ConfigError as exc:
        raise ConfigError(f"prune.source: {exc}") from None
    pruning = Pruning.of(cfg, source.model_cfg)
    first = Pruned(source.model, source.model_cfg)
    if not pruning.gated:
        first = pruning.cut_once(first)
    return Prepared(
        cfg=cfg,
        materials=PruneRun(pruning, data),
        handed=first,
        data=data,
        tokenizer=tokenizer,
        tags={tracking.SOURCE: source.run_id or source.source},
        begin=_begin(pruning, source, first, ctx),
    )
