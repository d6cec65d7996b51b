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
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.loggers import MLFlowLogger

from ablate.datamodules.classification import ClassificationDataModule
from ablate.lightning_modules.config import ExperimentConfig
from ablate.lightning_modules.errors import ConfigError
from ablate.lightning_modules.finetune import FinetuneModule
from ablate.sweeps import tracking
from ablate.sweeps.trainer import build_trainer, fit
from ablate.sweeps.weights import load_source


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
        source = load_source(f.source, uri, tmp, field="finetune.source")
        if source.tokenizer is None:
            raise ConfigError(
                f"finetune.source: {f.source} has no tokenizer.json beside its weights; fine-tuning "
                f"needs the tokenizer it was pre-trained with"
            )
        data = ClassificationDataModule(f, source.tokenizer, seed=cfg.seed)
        data.setup("fit")
        module = FinetuneModule(cfg, source.model)

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
            return {**fit(trainer, module, data), **baseline}

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
