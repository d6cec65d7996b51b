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

from datamodules.classification import ClassificationDataModule
from lightning_modules.config import ExperimentConfig
from lightning_modules.errors import ConfigError
from lightning_modules.finetune import FinetuneModule
from lightning_modules.loop import loop_callbacks
from sweeps import tracking
from sweeps.runner import RunResult, lightning_strategy, tracked_run
from sweeps.weights import load_source


def build_finetune_trainer(cfg: ExperimentConfig, logger: MLFlowLogger | None, steps_per_epoch: int) -> pl.Trainer:
    """Validation every ``finetune.val_every`` steps (across epochs), early stopping on the dev metric."""
    f, t = cfg.finetune, cfg.trainer
    stop = EarlyStopping(monitor=f"{f.task}/{f.metric}", mode="max", patience=f.patience, check_finite=True)
    callbacks: list[pl.Callback] = [stop, *loop_callbacks(t)]
    return pl.Trainer(
        max_steps=f.max_steps, val_check_interval=min(f.val_every, f.max_steps, steps_per_epoch),
        check_val_every_n_epoch=None, num_sanity_val_steps=0, gradient_clip_val=cfg.optim.grad_clip or None,
        precision=t.precision, accelerator=t.accelerator, devices=t.devices, strategy=lightning_strategy(t),
        logger=logger or False, callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=t.progress,
        enable_model_summary=False, log_every_n_steps=t.log_every,
    )


def finetune(cfg: ExperimentConfig, *, tracking_uri: str | None = None, experiment: str | None = None,
             parent_run_id: str | None = None, tags: dict[str, str] | None = None, name: str | None = None,
             extra_params: dict[str, str] | None = None) -> RunResult:
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
            raise ConfigError(f"finetune.source: {f.source} has no tokenizer.json beside its weights; fine-tuning "
                              f"needs the tokenizer it was pre-trained with")
        data = ClassificationDataModule(f, source.tokenizer, seed=cfg.seed)
        data.setup("fit")
        module = FinetuneModule(cfg, source.model)

        def work(client: Any, run_id: str) -> dict[str, float]:
            baseline = {f"{f.task}/majority_accuracy": data.majority_accuracy,
                        f"{f.task}/train_examples": float(data.num_train)}
            for key, value in baseline.items():
                client.log_metric(run_id, key, value)
            logger = MLFlowLogger(tracking_uri=uri, run_id=run_id, log_model=False)
            steps_per_epoch = max(1, len(data.train_dataloader()))
            trainer = build_finetune_trainer(cfg, logger, steps_per_epoch)
            with tracking.scoped_tracking_uri():
                trainer.fit(module, datamodule=data)
            if trainer.interrupted:
                raise KeyboardInterrupt
            return {**{k: float(v) for k, v in trainer.callback_metrics.items()}, **baseline}

        return tracked_run(cfg, uri, work, experiment=experiment, name=name, parent_run_id=parent_run_id,
                           tags={tracking.SOURCE: source.run_id or source.source, **(tags or {})}, inputs={},
                           tokenizer=source.tokenizer, extra_params=extra_params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
