"""Quantization in a run: the ``quant`` regime (``quant.source``: quantize a trained model) and the
last step of any other run whose ``quant.method`` is set (its trained model, quantized).

What a quantized run logs, beside what every run logs:

- the quantized model's held-out MLM metrics (``val/mlm_acc``, ``val/mlm_loss``, ``val/loss``,
  evaluated on the CPU on the run's validation batches) as the run's final values, and the same of
  the float model it came from as ``quant/fp32_*``, with ``quant/mlm_acc_drop`` (float - quantized);
- ``model_bytes`` and the CPU latency of the quantized model (``quant/fp32_model_bytes`` the float
  one's), ``quant/avg_bits`` (bits per quantized weight);
- for ``weight-mixed``, the layers' sensitivities, ranks and bits as the artifact ``quant/plan.csv``.

The run's ``model/`` artifacts keep the float weights (after QAT, the trained ones) and the config:
quantization is a deterministic function of both, redone where the model is used (a fine-tuning
task quantizes its fine-tuned classifier the same way).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import pandas as pd
import torch
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn

from ablate.lightning_modules.accounting import quantized_counts
from ablate.lightning_modules.config import ExperimentConfig
from ablate.lightning_modules.pretrain import PretrainModule
from ablate.lightning_modules.quantization.apply import prepare_qat, quantize, stored_bytes
from ablate.lightning_modules.quantization.mixed import average_bits, choose_plan
from ablate.sweeps.trainer import ValidateAtEnd, build_trainer, fit
from ablate.sweeps.weights import Source, log_weights

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
    ``trainer.val_batches``); its metrics."""
    val_batches = 1.0 if cfg.regime == "finetune" else None
    trainer = build_trainer(on_cpu(cfg), None, [], val_batches=val_batches)
    (results,) = trainer.validate(module, datamodule=data, verbose=False)
    return {k: float(v) for k, v in results.items()}


def first_batches(data: pl.LightningDataModule, n: int) -> list[dict[str, torch.Tensor]]:
    """The first ``n`` training batches, unpacked: the calibration set of ``weight-mixed``."""
    batches: list[dict[str, torch.Tensor]] = []
    for batch in data.train_dataloader():
        batches.append(data.on_after_batch_transfer(batch, 0))
        if len(batches) == n:
            break
    return batches


def quantized_model(
    model: nn.Module,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor],
) -> tuple[nn.Module, pd.DataFrame | None, float | None]:
    """A quantized copy of ``model`` (left as it is), for ``weight-mixed`` the table of its plan, and its
    bits per quantized weight. ``weight-mixed`` ranks the layers by ``loss`` (of a model on a batch)
    over the first ``quant.calib_batches`` training batches of ``data``."""
    model = copy.deepcopy(model).cpu().eval()
    if cfg.quant.method != "weight-mixed":
        return quantize(model, cfg.quant), None, cfg.quant.average_bits
    batches = first_batches(data, cfg.quant.calib_batches)

    def mean_loss(m: nn.Module) -> float:
        m.eval()
        with torch.inference_mode():
            return sum(float(loss(m, b)) for b in batches) / len(batches)

    plan, table = choose_plan(model, mean_loss, cfg.quant)
    return quantize(model, cfg.quant, plan), table, average_bits(model, plan)


def quantize_and_log(
    model: nn.Module,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    client: Any,
    run_id: str,
    step: int,
    fp32: dict[str, float],
) -> dict[str, float]:
    """Quantize a trained pre-training model as ``cfg.quant`` says, evaluate it, log it (see the
    module's docstring) at ``step``; the metrics logged. ``fp32``: the float model's MLM metrics."""
    eval_cfg = on_cpu(cfg)
    quantized, table, bits = quantized_model(model, cfg, data, lambda m, b: m(b).mlm_loss)
    metrics = validate(PretrainModule(eval_cfg, quantized), eval_cfg, data)
    metrics.update({f"quant/fp32_{k.removeprefix('val/')}": fp32[k] for k in MLM if k in fp32})
    if "val/mlm_acc" in fp32 and "val/mlm_acc" in metrics:
        metrics["quant/mlm_acc_drop"] = fp32["val/mlm_acc"] - metrics["val/mlm_acc"]
    metrics["quant/fp32_model_bytes"] = float(stored_bytes(model))
    metrics.update(quantized_counts(quantized, eval_cfg))
    if bits is not None:
        metrics["quant/avg_bits"] = bits
    if table is not None:
        client.log_text(run_id, table.to_csv(index=False), "quant/plan.csv")
    for key, value in metrics.items():
        client.log_metric(run_id, key, value, step=step)
    return metrics


def quant_train(
    cfg: ExperimentConfig, source: Source, data: pl.LightningDataModule, uri: str, client: Any, run_id: str
) -> dict[str, float]:
    """The ``quant`` regime in run ``run_id``: evaluate ``source``, train it with fake quantization for
    ``trainer.max_steps`` when the method is ``qat-int8``, quantize, evaluate and log it."""
    model, eval_cfg = source.model, on_cpu(cfg)
    fp32 = validate(PretrainModule(eval_cfg, model), eval_cfg, data)
    step = 0
    if cfg.quant.method == "qat-int8":
        model = prepare_qat(model)
        logger = MLFlowLogger(tracking_uri=uri, run_id=run_id, log_model=False)
        fit(build_trainer(cfg, logger, [ValidateAtEnd()]), PretrainModule(cfg, model), data)
        step = cfg.trainer.max_steps
    metrics = quantize_and_log(model, cfg, data, client, run_id, step, fp32)
    log_weights(client, run_id, model, cfg)
    return metrics
