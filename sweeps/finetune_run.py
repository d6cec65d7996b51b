"""One fine-tuning run (``finetune.source`` set): a pre-trained model on a classification task.

The source's own tokenizer encodes the task's data; the dev set is scored every
``finetune.val_every`` steps and training stops early after ``finetune.patience``
validations without a better ``finetune.metric``. The run logs every dev metric's curve,
the best value (``<task>/best_<metric>``) and the majority-class baseline
(``<task>/majority_accuracy``) to compare against.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch.nn.functional as F  # noqa: N812
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.loggers import MLFlowLogger

from ablate.datamodules.classification import ClassificationDataModule
from ablate.lightning_modules.config import ExperimentConfig
from ablate.lightning_modules.errors import ConfigError
from ablate.lightning_modules.finetune import FinetuneModule
from ablate.lightning_modules.quantization.apply import prepare_qat, stored_bytes
from ablate.sweeps import tracking
from ablate.sweeps.quant_run import quantized_model, validate
from ablate.sweeps.trainer import build_trainer, fit
from ablate.sweeps.weights import load_source


def quantize_classifier(
    module: FinetuneModule, cfg: ExperimentConfig, data: ClassificationDataModule, fp32: float
) -> dict[str, float]:
    """Quantize ``module``'s fine-tuned classifier as ``cfg.quant`` says (``weight-mixed``: layers ranked on
    training batches by the classification loss) and score the dev set with it on the CPU."""
    f = cfg.finetune
    quantized, _, bits = quantized_model(
        module.model, cfg, data, lambda m, b: F.cross_entropy(m(b).float(), b["labels"])
    )
    module.model = quantized  # the same dev metrics, on the quantized classifier
    scores = validate(module, cfg, data)
    out = {
        f"{f.task}/final_{f.metric}": scores[f"{f.task}/{f.metric}"],
        f"{f.task}/fp32_{f.metric}": fp32,
        "model_bytes": float(stored_bytes(quantized)),
    }
    return out if bits is None else {**out, "quant/avg_bits": bits}


def finetune(
    cfg: ExperimentConfig,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    name: str | None = None,
    extra_params: dict[str, str] | None = None,
) -> tracking.RunResult:
    """Fine-tune ``finetune.source`` on ``finetune.train`` as one MLflow run; its final dev metrics.

    The source, its tokenizer and the task's data are checked before the run is created.
    """
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    f = cfg.finetune
    uri = tracking.resolve_tracking_uri(tracking_uri or cfg.tracking.tracking_uri, cfg.tracking.root)
    tmp = Path(tempfile.mkdtemp(prefix="ablate-finetune-"))
    try:
        source = load_source(f.source, uri, tmp, field="finetune.source", quantized=True)
        if source.tokenizer is None:
            raise ConfigError(
                f"finetune.source: {f.source} has no tokenizer.json beside its weights; fine-tuning "
                f"needs the tokenizer it was pre-trained with"
            )
        data = ClassificationDataModule(f, source.tokenizer, seed=cfg.seed)
        data.setup("fit")
        module = FinetuneModule(cfg, source.model)
        if cfg.quant.method == "qat-int8":  # fine-tuned with fake quantization (Q8BERT), converted at the end
            module.model = prepare_qat(module.model)

        def work(client: Any, run_id: str) -> dict[str, float]:
            baseline = {
                f"{f.task}/majority_accuracy": data.majority_accuracy,
                f"{f.task}/train_examples": float(data.num_train),
            }
            for key, value in baseline.items():
                client.log_metric(run_id, key, value)
            logger = MLFlowLogger(tracking_uri=uri, run_id=run_id, log_model=False)
            steps_per_epoch = max(1, len(data.train_dataloader()))
            stop = EarlyStopping(monitor=f"{f.task}/{f.metric}", mode="max", patience=f.patience, check_finite=True)
            trainer = build_trainer(
                cfg,
                logger,
                [stop],
                max_steps=f.max_steps,  # validation across epoch ends
                val_every=min(f.val_every, steps_per_epoch),
                val_batches=1.0,
            )
            metrics = {**fit(trainer, module, data), **baseline}
            # the model the run leaves: the best validation's weights (early stopping's choice) ...
            module.restore_best()
            best = metrics[f"{f.task}/best_{f.metric}"]
            metrics[f"{f.task}/final_{f.metric}"] = best
            metrics["model_bytes"] = float(stored_bytes(module.model))  # the classifier's
            if cfg.quant.enabled:  # ... quantized: its dev score is scored again
                metrics.update(quantize_classifier(module, cfg, data, best))
            for key in (f"{f.task}/final_{f.metric}", f"{f.task}/fp32_{f.metric}", "model_bytes", "quant/avg_bits"):
                if key in metrics:
                    client.log_metric(run_id, key, metrics[key], step=trainer.global_step)
            return metrics

        return tracking.tracked_run(
            cfg,
            uri,
            work,
            experiment=experiment,
            name=name,
            parent_run_id=parent_run_id,
            tags={tracking.SOURCE: source.run_id or source.source, **(tags or {})},
            inputs={},
            tokenizer=source.tokenizer,
            extra_params=extra_params,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
