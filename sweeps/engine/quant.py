"""Quantization in a run: the ``quant`` regime (``quant.source``: quantize a trained model) and the
last step of any other run whose ``quant.method`` is set (its trained model, quantized).

What a quantized run logs, beside what every run logs:

- the quantized model's held-out MLM metrics (``val/mlm_acc``, ``val/mlm_loss``, ``val/loss``,
  evaluated on the CPU on the run's validation batches) as the run's final values, and the same of
  the float model it came from as ``quant/fp32_*``, with ``quant/mlm_acc_drop`` (float - quantized);
- ``model_bytes`` and the CPU latency of the quantized model (``quant/fp32_model_bytes`` the float
  one's), ``quant/avg_bits`` (bits per quantized weight);
- ``quant/layers``: how many layers of the model evaluated hold quantized weights (the encoder's
  Linears, and the embedding tables ``quant.embeddings`` quantizes); a model with none is an error
  (:class:`~ablate.lightning_modules.methods.quantization.apply.QuantizationNotApplied`), never scored;
- for ``weight-mixed``, the layers' sensitivities, ranks and bits as the artifact ``quant/plan.csv``.

The ``quant`` regime with ``quant.method: none`` is a comparison's float arm: the source evaluated as
the quantized arms are (held-out MLM metrics on the CPU in float32, ``model_bytes``, CPU latency),
``quant/layers`` 0; the check that a quantized model holds integers applies wherever a method is set.

The run's ``model/`` artifacts keep the float weights (after QAT, the trained ones) and the config:
quantization is a deterministic function of both, redone where the model is used (a fine-tuning
task quantizes its fine-tuned classifier the same way).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, replace
from typing import cast

import lightning.pytorch as pl
import pandas as pd
import torch
from torch import nn

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.quant import WEIGHT_BITS
from ablate.lightning_modules.measure.accounting import quantized_counts, stored_bytes
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.quantization.apply import (
    Plan,
    QuantizationNotApplied,
    convert_weight_qat,
    prepare_qat,
    prepare_weight_qat,
    quantize,
    quantized_layers,
    uniform_plan,
)
from ablate.lightning_modules.methods.quantization.mixed import BatchLoss, average_bits, choose_plan
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.sweeps.engine.context import ActiveRun
from ablate.sweeps.engine.trainer import ValidateAtEnd, build_trainer, fit, run_logger
from ablate.sweeps.engine.weights import Source, log_weights

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
class QuantPlan:
    """How a model's weight-only layers are quantized: bits per layer (None: another method), the
    table that explains a ``weight-mixed`` plan, and bits per quantized weight (None: not known)."""

    plan: Plan | None
    table: pd.DataFrame | None
    bits: float | None


def plan_for(model: nn.Module, cfg: ExperimentConfig, data: pl.LightningDataModule, loss: BatchLoss) -> QuantPlan:
    """``cfg.quant``'s plan for ``model`` (left as it is): ``weight-mixed`` ranks the layers by ``loss`` (of
    a model on a batch) over the first ``quant.calib_batches`` training batches of ``data``, as
    ``quant.sensitivity`` says; a uniform weight-only method gives every layer its bits."""
    q = cfg.quant
    if q.method == "weight-mixed":
        plan, table = choose_plan(model, loss, first_batches(data, q.calib_batches), q)
        return QuantPlan(plan, table, average_bits(model, plan))
    if q.method in WEIGHT_BITS:
        return QuantPlan(uniform_plan(model, WEIGHT_BITS[q.method]), None, q.average_bits)
    return QuantPlan(None, None, q.average_bits)


def quantized_model(
    model: nn.Module,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    loss: BatchLoss,
    run: ActiveRun | None = None,
) -> tuple[nn.Module, QuantPlan]:
    """A quantized copy of ``model`` (left as it is) and its :class:`QuantPlan` (:func:`planned`)."""
    model = copy.deepcopy(model).cpu().eval()
    plan = planned(model, cfg, data, loss, run)
    return quantize(model, cfg.quant, plan.plan), plan


def quantize_and_log(
    model: nn.Module,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    run: ActiveRun,
    step: int,
    fp32: dict[str, float],
    done: tuple[nn.Module, QuantPlan] | None = None,
) -> dict[str, float]:
    """Quantize a trained pre-training model as ``cfg.quant`` says, evaluate it, log it (see the
    module's docstring) at ``step``; the metrics logged. ``fp32``: the float model's MLM metrics;
    ``done``: the model already quantized (after quantization-aware training) and its plan."""
    eval_cfg = on_cpu(cfg)
    quantized, plan = quantized_model(model, cfg, data, mlm_loss, run) if done is None else done
    run.phase("quantized evaluation", f"{cfg.quant.method} on the CPU")
    layers = quantized_layers(quantized)  # quantize() checked its layers; this is what is scored
    if not layers:
        raise QuantizationNotApplied(
            f"quant.method: {cfg.quant.method}: the model to evaluate holds no quantized layer; it would be "
            "scored as the float model"
        )
    table, bits = plan.table, plan.bits
    quantized = cast(PretrainingModel, quantized)  # a pre-training model, its layers quantized in place
    metrics = validate(PretrainModule(eval_cfg, quantized), eval_cfg, data)
    metrics.update({f"quant/fp32_{k.removeprefix('val/')}": fp32[k] for k in MLM if k in fp32})
    if "val/mlm_acc" in fp32 and "val/mlm_acc" in metrics:
        metrics["quant/mlm_acc_drop"] = fp32["val/mlm_acc"] - metrics["val/mlm_acc"]
    metrics["quant/fp32_model_bytes"] = float(stored_bytes(model))
    metrics.update(quantized_counts(quantized, eval_cfg))
    metrics["quant/layers"] = float(len(layers))
    if bits is not None:
        metrics["quant/avg_bits"] = bits
    if table is not None:
        run.text(table.to_csv(index=False), "quant/plan.csv")
    run.log(metrics, step=step)
    return metrics


def quant_train(
    cfg: ExperimentConfig, source: Source, data: pl.LightningDataModule, run: ActiveRun
) -> dict[str, float]:
    """The ``quant`` regime in ``run``: evaluate ``source``, train it with fake quantization for
    ``trainer.max_steps`` when the method is ``qat-int8``, quantize, evaluate and log it.

    With ``quant.method: none`` (and float embeddings) the source is the float arm of a comparison:
    it is evaluated as the quantized arms are (on the CPU, in float32: held-out MLM metrics, stored
    bytes, CPU latency), and no quantized model is claimed (``quant/layers`` 0)."""
    model, eval_cfg, q = source.model, on_cpu(cfg), cfg.quant
    run.phase("evaluation", "the source in float32 on the CPU")
    fp32 = validate(PretrainModule(eval_cfg, model), eval_cfg, data)
    if not q.enabled:
        metrics = {**fp32, **quantized_counts(model, eval_cfg), "quant/layers": 0.0}
        run.log(metrics)
        log_weights(run.client, run.run_id, model, cfg)
        return metrics
    step, done = 0, None
    logger = run_logger(run.uri, run.run_id)
    if q.method == "qat-int8":
        model = cast(PretrainingModel, prepare_qat(model))  # prepared in place
        run.phase("QAT", f"int8 fake-quantized, {cfg.trainer.max_steps} steps")
        fit(build_trainer(cfg, logger, [ValidateAtEnd()]), PretrainModule(cfg, model), data)
        step = cfg.trainer.max_steps
    elif q.qat_steps:  # Q-BERT: the plan on the float model, then trained fake-quantized at its bits
        plan = planned(model, cfg, data, mlm_loss, run)
        assert plan.plan is not None  # qat_steps is checked to come with a weight-only method
        model = cast(PretrainingModel, prepare_weight_qat(model, plan.plan, q))  # prepared in place
        qat_cfg = replace(cfg, trainer=replace(cfg.trainer, max_steps=q.qat_steps))
        run.phase("QAT", f"{q.method} fake-quantized, {q.qat_steps} steps")
        fit(build_trainer(qat_cfg, logger, [ValidateAtEnd()]), PretrainModule(qat_cfg, model), data)
        step = q.qat_steps
        done = (convert_weight_qat(copy.deepcopy(model), plan.plan, q), plan)
    metrics = quantize_and_log(model, cfg, data, run, step, fp32, done)
    log_weights(run.client, run.run_id, model, cfg)  # float weights (after QAT, the trained ones)
    return metrics


def planned(
    model: nn.Module, cfg: ExperimentConfig, data: pl.LightningDataModule, loss: BatchLoss, run: ActiveRun | None
) -> QuantPlan:
    """:func:`plan_for`, said as ``run``'s phase when it measures sensitivities (``weight-mixed``)."""
    q = cfg.quant
    if q.method == "weight-mixed" and run is not None:
        how = f"Hessian top eigenvalues, {q.hessian_iters} iterations" if q.sensitivity == "hessian" else "loss"
        run.phase("sensitivity", f"each layer's {how} on {q.calib_batches} batches")
    return plan_for(model, cfg, data, loss)


def mlm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The masked-LM loss of a pre-training model on one batch: what its plan is ranked by."""
    return model(batch).mlm_loss  # type: ignore[no-any-return]
