"""Quantization in a run: the ``quant`` regime (``quant.source``: :func:`prepare_quant`, :func:`quant_plan`) and
the last step of any other run whose ``quant.method`` is set. :func:`quantize_and_score` is every run's one
quantize-and-score (it keeps the quantized model as ``model/quantized.safetensors``); :func:`quantize_and_log`
scores a pre-training model's. What a quantized run logs: docs/guides/quantization.md ("What a run logs")."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import cast

import lightning.pytorch as pl
import pandas as pd
import torch
from torch import nn

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.quant import WEIGHT_BITS
from ablate.lightning_modules.measure.accounting import quantized_counts, stored_bytes
from ablate.lightning_modules.measure.cache import cached_counts
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.quantization.apply import (
    LayerBits,
    QuantizationNotApplied,
    convert_weight_qat,
    prepare_qat,
    prepare_weight_qat,
    quantize,
    quantized_layers,
    uniform_plan,
)
from ablate.lightning_modules.methods.quantization.mixed import BatchLoss, average_bits, choose_plan
from ablate.lightning_modules.methods.train_module import OptimSetup
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepared, RunContext
from ablate.sweeps.engine.inputs import checked_source, corpus, tokenizer_of
from ablate.sweeps.engine.phases import Finisher, Leaving, Metrics, Phase, RunPlan
from ablate.sweeps.engine.sources import Source
from ablate.sweeps.engine.trainer import build_trainer
from ablate.sweeps.engine.weights import log_quantized

MLM = ("val/loss", "val/mlm_loss", "val/mlm_acc")
"""The held-out metrics compared before and after quantization."""


def on_cpu(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` for evaluating a quantized model: one CPU process, float32, eager."""
    trainer = dataclasses.replace(
        cfg.trainer, accelerator="cpu", devices=1, num_nodes=1, strategy="auto", precision="32-true", compile=False
    )
    return dataclasses.replace(cfg, trainer=dataclasses.replace(trainer, profiler=None))


def validate(module: pl.LightningModule, cfg: ExperimentConfig, data: pl.LightningDataModule) -> dict[str, float]:
    """Lightning's validation of ``module`` on the CPU (the full dev set of a fine-tuning task, else
    ``trainer.val_batches``); its metrics (every dev set's: a task with several, MNLI, logs them all at
    the epoch's end, so each loader's results hold them all)."""
    val_batches = 1.0 if cfg.regime == "finetune" else None
    trainer = build_trainer(on_cpu(cfg), None, [], val_batches=val_batches)
    results = trainer.validate(module, datamodule=data, verbose=False)[0]
    return {k: float(v) for k, v in results.items()}


def first_batches(data: pl.LightningDataModule, n: int) -> list[dict[str, torch.Tensor]]:
    """The first ``n`` training batches, unpacked: the calibration set of ``weight-mixed``."""
    batches: list[dict[str, torch.Tensor]] = []
    for batch in data.train_dataloader():
        batches.append(data.on_after_batch_transfer(batch, 0))
        if len(batches) == n:
            break
    return batches


@dataclass(frozen=True)
class BitAllocation:
    """How a model's weight-only layers are quantized: bits per layer (None: another method), the
    table that explains a ``weight-mixed`` choice, and bits per quantized weight (None: not known)."""

    layers: LayerBits | None
    table: pd.DataFrame | None
    bits: float | None


@dataclass(frozen=True)
class QuantDone:
    """A model quantized as it trained (converted after quantization-aware training) and its plan."""

    model: nn.Module
    allocation: BitAllocation


def qat_plan(
    model: nn.Module, cfg: ExperimentConfig, data: pl.LightningDataModule, loss: BatchLoss, run: ActiveRun
) -> BitAllocation:
    """Q-BERT's plan for a quantization-aware phase: bits per layer, from the float model (:func:`planned`)."""
    plan = planned(model, cfg, data, loss, run)
    assert plan.layers is not None  # qat_steps is checked to come with a weight-only method
    return plan


def after_qat(model: nn.Module, plan: BitAllocation | None, cfg: ExperimentConfig) -> QuantDone:
    """The model a quantization-aware phase trained (left as it is), converted to the integers it
    trained for at ``plan``'s bits: what the run scores instead of quantizing again."""
    assert plan is not None and plan.layers is not None  # handed on by the phase's module
    return QuantDone(convert_weight_qat(copy.deepcopy(model), plan.layers, cfg.quant), plan)


def plan_for(model: nn.Module, cfg: ExperimentConfig, data: pl.LightningDataModule, loss: BatchLoss) -> BitAllocation:
    """``cfg.quant``'s plan for ``model`` (left as it is): ``weight-mixed`` ranks the layers by ``loss`` (of
    a model on a batch) over the first ``quant.calib_batches`` training batches of ``data``, as
    ``quant.sensitivity`` says; a uniform weight-only method gives every layer its bits."""
    q = cfg.quant
    if q.method == "weight-mixed":
        plan, table = choose_plan(model, loss, first_batches(data, q.calib_batches), q)
        return BitAllocation(plan, table, average_bits(model, plan))
    if q.method in WEIGHT_BITS:
        return BitAllocation(uniform_plan(model, WEIGHT_BITS[q.method]), None, q.average_bits)
    return BitAllocation(None, None, q.average_bits)


def quantized_model(
    model: nn.Module,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    loss: BatchLoss,
    run: ActiveRun | None = None,
) -> tuple[nn.Module, BitAllocation]:
    """A quantized copy of ``model`` (left as it is) and its :class:`BitAllocation` (:func:`planned`)."""
    model = copy.deepcopy(model).cpu().eval()
    plan = planned(model, cfg, data, loss, run)
    return quantize(model, cfg.quant, plan.layers), plan


Scorer = Callable[[nn.Module], dict[str, float]]
"""Scores a quantized model as its run scores its float one (held-out MLM metrics, the dev set)."""


def quantize_and_score(
    model: nn.Module,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    loss: BatchLoss,
    score: Scorer,
    run: ActiveRun | None,
    done: QuantDone | None = None,
) -> tuple[dict[str, float], BitAllocation]:
    """The one quantize-and-score of every run: ``model`` (left as it is) quantized as ``cfg.quant`` says
    (``weight-mixed``: its layers ranked by ``loss`` on training batches; ``done``: already quantized
    after quantization-aware training), checked to hold quantized layers, scored by ``score``; with its
    ``quant/avg_bits`` and ``quant/layers``, and the plan's table as the run's ``quant/plan.csv``."""
    quantized, plan = quantized_model(model, cfg, data, loss, run) if done is None else (done.model, done.allocation)
    if run is not None:
        run.phase("quantized evaluation", f"{cfg.quant.method} on the CPU")
    layers = quantized_layers(quantized)  # quantize() checked its layers; this is what is scored
    if not layers:
        raise QuantizationNotApplied(
            f"quant.method: {cfg.quant.method}: the model to evaluate holds no quantized layer; it would be "
            "scored as the float model"
        )
    metrics = {**score(quantized), "quant/layers": float(len(layers))}
    if plan.bits is not None:
        metrics["quant/avg_bits"] = plan.bits
    if plan.table is not None and run is not None:
        run.text(plan.table.to_csv(index=False), "quant/plan.csv")
    if run is not None:  # the model as scored: integer weights and scales, beside the float model/ artifacts
        log_quantized(run.client, run.run_id, quantized, cfg, plan.layers, plan.bits)
    return metrics, plan


def quantize_and_log(
    model: nn.Module,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    run: ActiveRun,
    step: int,
    fp32: dict[str, float],
    done: QuantDone | None = None,
) -> dict[str, float]:
    """A trained pre-training model quantized and scored (:func:`quantize_and_score`) on its held-out
    MLM metrics beside the float model's (``fp32``), logged at ``step`` (see the module's docstring)."""
    eval_cfg = on_cpu(cfg)

    def score(quantized: nn.Module) -> dict[str, float]:
        q = cast(PretrainingModel, quantized)  # a pre-training model, its layers quantized in place
        metrics = validate(PretrainModule(eval_cfg, q), eval_cfg, data)
        metrics.update({f"quant/fp32_{k.removeprefix('val/')}": fp32[k] for k in MLM if k in fp32})
        if "val/mlm_acc" in fp32 and "val/mlm_acc" in metrics:
            metrics["quant/mlm_acc_drop"] = fp32["val/mlm_acc"] - metrics["val/mlm_acc"]
        metrics["quant/fp32_model_bytes"] = float(stored_bytes(model))
        return {**metrics, **quantized_counts(q, eval_cfg)}

    metrics, _ = quantize_and_score(model, cfg, data, mlm_loss, score, run, done)
    run.log(metrics, step=step)
    return metrics


@dataclass(frozen=True)
class QuantRun:
    """The ``quant`` regime's materials: the run's config (the source's architecture as ``model``), the
    trained model to quantize and the corpus (validation batches, calibration and QAT batches)."""

    cfg: ExperimentConfig
    source: Source
    data: pl.LightningDataModule

    def leaving(self, handed: QuantState) -> Leaving:
        """What the run logs as its weights: the model (after QAT, the trained float weights), its config."""
        return handed.model, self.cfg, None


@dataclass(frozen=True)
class QuantState:
    """What the ``quant`` regime's phases hand on.

    Attributes:
        model: the model now: the source, or trained fake-quantized in place by a QAT phase.
        fp32: the source's held-out MLM metrics in float32 on the CPU (evaluated once, before any QAT).
        qat: Q-BERT's plan (its bits per layer) for its QAT phase.
        done: after that phase, the model quantized as it trained and its plan.
    """

    model: PretrainingModel
    fp32: Metrics | None = None
    qat: BitAllocation | None = None
    done: QuantDone | None = None


def _fp32(m: QuantRun, h: QuantState, run: ActiveRun) -> Metrics:
    """The source's float evaluation: handed on, or evaluated now (before any QAT)."""
    if h.fp32 is not None:
        return h.fp32
    run.phase("evaluation", "the source in float32 on the CPU")
    eval_cfg = on_cpu(m.cfg)
    return validate(PretrainModule(eval_cfg, h.model), eval_cfg, m.data)


def _qat_int8(m: QuantRun, h: QuantState, run: ActiveRun) -> tuple[pl.LightningModule, QuantState]:
    fp32 = _fp32(m, h, run)
    model = cast(PretrainingModel, prepare_qat(h.model))  # prepared in place
    return PretrainModule(m.cfg, model), replace(h, model=model, fp32=fp32)


def _qat_weights(m: QuantRun, h: QuantState, run: ActiveRun) -> tuple[pl.LightningModule, QuantState]:
    """Q-BERT: the plan on the float model, then the model fake-quantized at its bits."""
    fp32 = _fp32(m, h, run)
    q = m.cfg.quant
    plan = qat_plan(h.model, m.cfg, m.data, mlm_loss, run)
    assert plan.layers is not None
    model = cast(PretrainingModel, prepare_weight_qat(h.model, plan.layers, q))  # prepared in place
    module = PretrainModule(replace(m.cfg, trainer=replace(m.cfg.trainer, max_steps=q.qat_steps)), model)
    return module, replace(h, model=model, fp32=fp32, qat=plan)


def _converted(m: QuantRun, h: QuantState, module: pl.LightningModule, metrics: Metrics) -> tuple[QuantState, Metrics]:
    return replace(h, done=after_qat(h.model, h.qat, m.cfg)), {}


def _float_arm(m: QuantRun, h: QuantState, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """``quant.method: none``: the source evaluated as the quantized arms are, ``quant/layers`` 0."""
    out = {**_fp32(m, h, run), **quantized_counts(h.model, on_cpu(m.cfg)), "quant/layers": 0.0}
    run.log(out, step=step)
    return out


def _quantized(m: QuantRun, h: QuantState, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    return quantize_and_log(h.model, m.cfg, m.data, run, step, _fp32(m, h, run), h.done)


def quant_plan(cfg: ExperimentConfig) -> RunPlan[QuantRun, QuantState]:
    """The ``quant`` regime: for ``qat-int8``, ``trainer.max_steps`` of int8 fake-quantized training; for
    Q-BERT's ``quant.qat_steps``, its plan's bits fake-quantized; then quantized and scored against the
    source's float evaluation (``quant.method: none``: the float arm, scored as the quantized ones)."""
    q = cfg.quant
    phases: list[Phase[QuantRun, QuantState]] = []
    if q.method == "qat-int8":
        how, optim = "new module (the source, int8 fake-quantized)", OptimSetup.pretraining(cfg, cfg.trainer.max_steps)
        phases.append(Phase("QAT", cfg.trainer.max_steps, _qat_int8, how, optim=optim.describe()))
    elif q.qat_steps:
        how = f"new module (the source, {q.method} fake-quantized at its plan's bits)"
        optim = OptimSetup.pretraining(cfg, q.qat_steps)
        phases.append(Phase("QAT", q.qat_steps, _qat_weights, how, optim=optim.describe(), ended=_converted))
    score: Finisher[QuantRun, QuantState]
    if not q.enabled:
        score = Finisher("float evaluation", "the source in float32 on the CPU, as the quantized arms are", _float_arm)
    else:
        score = Finisher("quantize and score", f"{q.method}, held-out MLM metrics on the CPU", _quantized)
    return RunPlan(phases, (score,))


def planned(
    model: nn.Module, cfg: ExperimentConfig, data: pl.LightningDataModule, loss: BatchLoss, run: ActiveRun | None
) -> BitAllocation:
    """:func:`plan_for`, said as ``run``'s phase when it measures sensitivities (``weight-mixed``)."""
    q = cfg.quant
    if q.method == "weight-mixed" and run is not None:
        how = f"Hessian top eigenvalues, {q.hessian_iters} iterations" if q.sensitivity == "hessian" else "loss"
        run.phase("sensitivity", f"each layer's {how} on {q.calib_batches} batches")
    return plan_for(model, cfg, data, loss)


def mlm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The masked-LM loss of a pre-training model on one batch: what its plan is ranked by."""
    return model(batch).mlm_loss  # type: ignore[no-any-return]


def prepare_quant(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared[QuantRun, QuantState]:
    """Quantizing ``quant.source`` (trained with fake quantization first for ``qat-int8``)."""
    data = corpus(cfg)
    tokenizer = tokenizer_of(data)
    source = checked_source(cfg, cfg.quant.source, "quant.source", uri, tokenizer)  # type: ignore[arg-type]
    cfg = replace(cfg, model=source.model_cfg)  # the source's architecture, logged as the run's
    inputs, measured_on = ctx.measure(cached_counts, source.model, cfg.model, cfg)
    return Prepared(
        cfg=cfg,
        materials=QuantRun(cfg, source, data),
        handed=QuantState(source.model),
        data=data,
        tokenizer=tokenizer,
        tags={tracking.SOURCE: source.run_id or source.source},
        inputs=inputs,
        params=measured_on,
    )
