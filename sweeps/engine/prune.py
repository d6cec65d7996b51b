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
from ablate.lightning_modules.methods.pruning.gates import check_supported
from ablate.lightning_modules.methods.pruning.schubert import Pruning, dims_markdown, dims_table
from ablate.lightning_modules.methods.train_module import OptimSetup
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepared, RunContext
from ablate.sweeps.engine.inputs import checked_source, corpus, tokenizer_of
from ablate.sweeps.engine.phases import Finisher, Leaving, Metrics, Phase, RunPlan
from ablate.sweeps.engine.quant import quantize_and_log
from ablate.sweeps.engine.sources import Source


@dataclass(frozen=True)
class PruneRun:
    """A pruning run's materials: the pruning under way and the corpus."""

    pruning: Pruning
    data: PretrainDataModule

    @property
    def cfg(self) -> ExperimentConfig:
        """The run's config with the model's shape now."""
        return dataclasses.replace(self.pruning.cfg, model=self.pruning.shape)

    def leaving(self, handed: None) -> Leaving:
        return self.pruning.model, self.cfg, None


def _gates(m: PruneRun, handed: None, run: ActiveRun) -> tuple[pl.LightningModule, None]:
    return m.pruning.gates(), None


def _cut(round_: int) -> Callable[[PruneRun, None, pl.LightningModule, Metrics], tuple[None, Metrics]]:
    """When round ``round_``'s gates have trained: the cut, and the parameters left (logged there)."""

    def cut(m: PruneRun, handed: None, module: pl.LightningModule, metrics: Metrics) -> tuple[None, Metrics]:
        assert isinstance(module, PruneModule)
        return None, {"prune/params": float(m.pruning.cut(module, round_))}

    return cut


def _retraining(m: PruneRun, handed: None, run: ActiveRun) -> tuple[pl.LightningModule, None]:
    return m.pruning.retraining(), None


def _shape(m: PruneRun, handed: None, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """The pruned shape: its counts and latency, the per-layer table, the layers as a tag and a param."""
    cfg = m.cfg
    new_cfg = cfg.model
    after, measured_on = cached_counts(m.pruning.model, new_cfg, cfg)
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


def _quantized(m: PruneRun, handed: None, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """The pruned model, quantized."""
    return quantize_and_log(m.pruning.model, m.cfg, m.data, run, step, metrics)


def prune_plan(cfg: ExperimentConfig) -> RunPlan[PruneRun, None]:
    """schuBERT: ``prune.rounds`` x (gates for ``prune.gate_steps``, cut; re-training for
    ``prune.finetune_steps``); a baseline: one cut, re-training for rounds x finetune_steps. Then the
    pruned shape and the quantized model (``quant.method``)."""
    p = cfg.prune
    optim = OptimSetup.pretraining(cfg, cfg.trainer.max_steps).describe()  # the re-training module's
    phases: list[Phase[PruneRun, None]] = []
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
    finishers = [
        Finisher[PruneRun, None]("pruned shape", "counts, latency and the per-layer table of the pruned model", _shape)
    ]
    if cfg.quant.enabled:
        finishers.append(
            Finisher("quantize and score", f"{cfg.quant.method}, held-out MLM metrics on the CPU", _quantized)
        )
    return RunPlan(phases, finishers)


def _begin(m: PruneRun, source: Source, ctx: RunContext) -> Callable[[ActiveRun, bool], None]:
    """What the run does first: a baseline cuts to the target at once, before its re-training; the
    source's counts and the parameters are logged at step 0 (not again when the run goes on)."""

    def begin(run: ActiveRun, going_on: bool) -> None:
        if not going_on:
            before, _ = ctx.measure(cached_counts, source.model, source.model_cfg, m.pruning.cfg)  # training device
            run.log({f"source/{key}": float(value) for key, value in before.items()})
            run.log({"prune/params": float(m.pruning.start)})
        if not m.pruning.gated:
            now = m.pruning.cut_once()
            if not going_on:
                run.log({"prune/params": float(now)})

    return begin


def prepare_prune(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared[PruneRun, None]:
    """Pruning ``prune.source`` as ``prune.method`` says."""
    data = corpus(cfg)
    tokenizer = tokenizer_of(data)
    source = checked_source(cfg, cfg.prune.source, "prune.source", uri, tokenizer)  # type: ignore[arg-type]
    try:  # a source that layer surgery cannot shrink (shared layers ...) fails before the run exists
        if cfg.prune.method != "fewer-layers":  # which only drops whole layers
            check_supported(source.model_cfg)
    except ConfigError as exc:
        raise ConfigError(f"prune.source: {exc}") from None
    m = PruneRun(Pruning(cfg, source.model, source.model_cfg), data)
    return Prepared(
        cfg=cfg,
        materials=m,
        handed=None,
        data=data,
        tokenizer=tokenizer,
        tags={tracking.SOURCE: source.run_id or source.source},
        begin=_begin(m, source, ctx),
    )
