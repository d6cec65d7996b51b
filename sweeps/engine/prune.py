"""One pruning run (``prune.source`` set) as one MLflow run: the algorithm is
:func:`ablate.lightning_modules.methods.pruning.schubert.prune`; this module trains its phases in one
MLflow run and logs the outcome.

The run logs the parameter count after each round (``prune/params``), latency and FLOPs
before (``source/...``) and after, the per-layer dimension table (``dims.md``/``dims.csv``)
and the pruned model as its ``model/`` artifacts, whose ``config.yaml`` (per-layer
``model.layers``) ``ablate train`` can also train from scratch.
"""

from __future__ import annotations

import dataclasses

import lightning.pytorch as pl

from ablate.datamodules.pretrain import PretrainDataModule
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.measure.accounting import metric_counts
from ablate.lightning_modules.methods.pruning.schubert import dims_markdown, dims_table, prune
from ablate.sweeps.engine.context import ActiveRun
from ablate.sweeps.engine.quant import quantize_and_log
from ablate.sweeps.engine.trainer import ValidateAtEnd, build_trainer, fit, run_logger
from ablate.sweeps.engine.weights import Source, log_weights


def prune_train(cfg: ExperimentConfig, source: Source, data: PretrainDataModule, run: ActiveRun) -> dict[str, float]:
    """Prune ``source`` as ``cfg.prune`` says inside ``run``, log the outcome; the last metrics."""
    client, run_id = run.client, run.run_id
    before, _ = metric_counts(source.model, source.model_cfg, cfg)  # on the training device, as the run's own
    run.log({f"source/{key}": float(value) for key, value in before.items()})
    logger = run_logger(run.uri, run_id)  # its offset: the steps of the phases before

    def train(module: pl.LightningModule, steps: int) -> dict[str, float]:
        """Train ``module`` for ``steps`` steps (validating at the end) and move the step offset on."""
        metrics = fit(build_trainer(cfg, logger, [ValidateAtEnd()], max_steps=steps), module, data)
        logger.offset += steps
        return metrics

    def record(params: int) -> None:
        run.log({"prune/params": params}, step=logger.offset)

    new_cfg, model, metrics = prune(cfg, source.model_cfg, source.model, train, record)
    final = dataclasses.replace(cfg, model=new_cfg)
    after, measured_on = metric_counts(model, new_cfg, final)
    run.log({key: float(value) for key, value in after.items()})
    for key, value in measured_on.items():
        client.log_param(run_id, key, value)
    table = dims_table(new_cfg)
    client.log_text(run_id, dims_markdown(table), "dims.md")
    client.log_text(run_id, table.assign(hidden=new_cfg.hidden_dim).to_csv(index=False), "dims.csv")
    layers = " ".join(f"{s.num_heads}/{s.qk_dim}/{s.v_dim}/{s.ffn_dim}" for s in new_cfg.layer_specs())
    client.set_tag(run_id, "ablate.pruned_layers", layers)
    # the shape found, as a param a report can show beside the metrics: "h=96 a/k/v/f per layer"
    client.log_param(run_id, "pruned.dims", f"h={new_cfg.hidden_dim} {layers}")
    if cfg.quant.enabled:  # the pruned model, quantized
        metrics.update(quantize_and_log(model, final, data, run, logger.offset, metrics))
    log_weights(client, run_id, model, final)
    return metrics
