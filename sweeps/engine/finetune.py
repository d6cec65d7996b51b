"""One fine-tuning run (``finetune.source`` set): a pre-trained model on a classification or
regression task.

The source's own tokenizer encodes the task's data; the dev set is scored every
``finetune.val_every`` steps and training stops early after ``finetune.patience``
validations without a better ``finetune.metric``. The run logs every dev metric's curve,
the best value (``<task>/best_<metric>``) and the majority-class baseline
(``<task>/majority_accuracy``) to compare against, and keeps its classifier (the best
validation's weights) as its ``model/`` artifacts: ``ablate export`` makes it a transformers
sequence classifier, and another fine-tuning run can learn from it (``distill.teacher``). Every dev
metric at that validation is logged as ``<dev set>/best_<metric>`` (``<task>/best_score``, MNLI's
``mnli-mm/best_accuracy``).

With ``distill.teacher`` (a fine-tuned classifier) the run is task distillation; with
``finetune.augment_copies`` its training set is enlarged by TinyBERT's augmentation; with
``finetune.exits`` it ends with FastBERT's self-distillation and early-exit evaluation.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping
from torch import nn

from ablate.datamodules.classification import ClassificationDataModule
from ablate.datamodules.squad import SquadDataModule
from ablate.datamodules.tokenizer import given_tokenizer
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.quant import check_group_size
from ablate.lightning_modules.measure.accounting import stored_bytes
from ablate.lightning_modules.methods.finetune import FinetuneModule, task_distill_module
from ablate.lightning_modules.methods.finetune import task_loss as loss_of
from ablate.lightning_modules.methods.quantization.apply import convert_weight_qat, prepare_qat
from ablate.lightning_modules.methods.span import span_loss
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepared, RunContext
from ablate.sweeps.engine.exits import exit_curve, used_at
from ablate.sweeps.engine.quant import QuantPlan, planned, quantized_model, validate
from ablate.sweeps.engine.span import span_data, span_latency, span_module
from ablate.sweeps.engine.trainer import build_trainer, fit, run_logger
from ablate.sweeps.engine.weights import (
    Source,
    check_same_tokenizer,
    load_classifier_source,
    load_source,
    log_weights,
)

AUGMENT_SAMPLE = "augment/sample.tsv"


def task_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The task's loss of a classifier on one batch (cross-entropy, or squared error for regression):
    what its quantization plan is ranked by."""
    if "start_positions" in batch:  # a span task's (SQuAD): the start and end cross-entropies
        return span_loss(model, batch)
    return loss_of(model(batch), batch["labels"])


def quantize_classifier(
    module: FinetuneModule,
    cfg: ExperimentConfig,
    data: ClassificationDataModule | SquadDataModule,
    fp32: float,
    run: ActiveRun | None = None,
    done: tuple[nn.Module, QuantPlan] | None = None,
) -> tuple[dict[str, float], QuantPlan]:
    """Quantize ``module``'s fine-tuned classifier as ``cfg.quant`` says (``weight-mixed``: layers ranked on
    training batches by the classification loss; ``done``: already quantized after quantization-aware
    training) and score the dev set with it on the CPU; the metrics and the plan."""
    f = cfg.finetune
    quantized, plan = quantized_model(module.model, cfg, data, task_loss, run) if done is None else done
    if run is not None:
        run.phase("quantized evaluation", f"{cfg.quant.method} on the CPU")
    module.model = quantized  # the same dev metrics, on the quantized classifier
    scores = validate(module, cfg, data)
    out = {
        f"{f.task}/final_{f.metric}": scores[f"{f.task}/{f.metric}"],
        f"{f.task}/fp32_{f.metric}": fp32,
        "model_bytes": float(stored_bytes(quantized)),
    }
    return (out if plan.bits is None else {**out, "quant/avg_bits": plan.bits}), plan


def best_name(name: str) -> str:
    """``<dev set>/best_<metric>``: a dev metric ``<dev set>/<metric>`` at the best validation."""
    dev, _, metric = name.partition("/")
    return f"{dev}/best_{metric}"


def _augmenter(cfg: ExperimentConfig, source: Source, uri: str, workdir: Path) -> tuple[Any, str]:
    """The masked LM that proposes augmentation candidates and its identity (for the cache key)."""
    f = cfg.finetune
    if f.augment_copies == 0:
        return None, ""
    if f.augment_model is None:
        return source.model, source.run_id or source.source
    mlm = load_source(f.augment_model, uri, workdir / "augment", field="finetune.augment_model")
    check_same_tokenizer(mlm, source.tokenizer, field="finetune.augment_model")  # type: ignore[arg-type]
    return mlm.model, mlm.run_id or mlm.source


def _module(cfg: ExperimentConfig, source: Source, uri: str, workdir: Path) -> tuple[FinetuneModule, dict[str, str]]:
    """The fine-tuning module (distilled from ``distill.teacher`` when set) and its extra tags."""
    if cfg.distill.teacher is None:
        module = FinetuneModule(cfg, source.model)
        return module, {}
    teacher = load_classifier_source(cfg.distill.teacher, uri, workdir / "teacher", field="distill.teacher")
    if teacher.tokenizer is not None:
        check_same_tokenizer(teacher, source.tokenizer)  # type: ignore[arg-type]
    module = task_distill_module(cfg, source.model, teacher.model, teacher.model_cfg)
    return module, {tracking.TEACHER: teacher.run_id or teacher.source}


def prepare_finetune(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared:
    """A run fine-tuning ``finetune.source`` on ``finetune.train``, prepared.

    The source, the teacher, the augmenting masked LM, their tokenizers and the task's data are
    checked (and the augmented set made) before the run is created.
    """
    f = cfg.finetune
    tmp = Path(tempfile.mkdtemp(prefix="ablate-finetune-"))
    stack.callback(shutil.rmtree, tmp, ignore_errors=True)
    assert f.source is not None  # a fine-tuning run's regime is resolved from its source
    source = load_source(f.source, uri, tmp, field="finetune.source", quantized=True)
    if cfg.data.tokenizer is not None:  # given: the source's own (checked), or the one it lacks
        _, given = given_tokenizer(cfg.data, None)
        if source.tokenizer is not None:
            check_same_tokenizer(source, given, field="finetune.source")
        source = replace(source, tokenizer=given)
    if source.tokenizer is None:
        raise ConfigError(
            f"finetune.source: {f.source} has no tokenizer (tokenizer.json or vocab.txt) beside its weights; "
            f"fine-tuning needs the tokenizer it was pre-trained with (name it: data.tokenizer)"
        )
    cfg = replace(cfg, model=source.model_cfg)  # the classifier's architecture is the source's
    try:
        check_group_size(cfg.quant, source.model_cfg)
    except ValueError as exc:
        raise ConfigError(f"{exc} (the model of finetune.source)") from None
    mlm, mlm_id = _augmenter(cfg, source, uri, tmp)
    module: FinetuneModule
    data: ClassificationDataModule | SquadDataModule
    if f.kind == "span":  # SQuAD: its own data and module (sweeps/engine/span.py)
        module, module_tags = span_module(cfg, source, uri, tmp)
        data = span_data(cfg, source.tokenizer)
    else:
        module, module_tags = _module(cfg, source, uri, tmp)
        data = ClassificationDataModule(
            f,
            source.tokenizer,
            seed=cfg.seed,
            limit_train=f.train_examples,
            mlm=mlm,
            cache_dir=cfg.data.cache_dir,
            mlm_id=mlm_id,
        )
        data.setup("fit")
    if cfg.quant.method == "qat-int8":  # fine-tuned with fake quantization (Q8BERT), converted at the end
        module.model = prepare_qat(module.model)
    return Prepared(
        cfg=cfg,
        work=lambda run: _fine_tune(run, cfg, module, data, source, ctx),
        tokenizer=source.tokenizer,
        tags={tracking.SOURCE: source.run_id or source.source, **module_tags},
    )


class StoppedEarly(Callback):
    """A fit resumed from a checkpoint written after early stopping had decided to stop ends at once:
    the checkpoint brings EarlyStopping's count of validations without improvement back, but not the
    Trainer's decision, and the fit would otherwise train on to its next validation."""

    def __init__(self, stop: EarlyStopping) -> None:
        self.stop = stop

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.stop.wait_count >= self.stop.patience:
            trainer.should_stop = True


def _fine_tune(
    run: ActiveRun,
    cfg: ExperimentConfig,
    module: FinetuneModule,
    data: ClassificationDataModule | SquadDataModule,
    source: Source,
    ctx: RunContext,
) -> dict[str, float]:
    """Fine-tune inside ``run``: the task (checkpointed and resumed as ``ctx`` says), then FastBERT's
    exits, Q-BERT's quantization-aware phase and the quantized classifier as the config says; the run's
    final metrics."""
    f = cfg.finetune
    majority = data.majority_accuracy  # None for regression
    baseline = {f"{f.task}/train_examples": float(data.num_train)}
    if majority is not None:
        baseline[f"{f.task}/majority_accuracy"] = majority
    run.log(baseline)
    if data.augment_sample is not None:
        run.text(data.augment_sample, AUGMENT_SAMPLE)
    logger = run_logger(run.uri, run.run_id)
    steps_per_epoch = max(1, len(data.train_dataloader()))
    # strict=False: the dev set is not scored while an intermediate stage trains the layers
    stop = EarlyStopping(
        monitor=f"{f.task}/{f.metric}", mode="max", patience=f.patience, check_finite=True, strict=False
    )
    val_every = min(f.val_every, steps_per_epoch)
    start, saving = ctx.checkpointing(run, None)  # the best validation's weights travel in last.ckpt
    callbacks = [stop, StoppedEarly(stop), *ctx.callbacks, *saving]
    trainer = build_trainer(
        cfg, logger, callbacks, max_steps=f.max_steps, val_every=val_every, val_batches=1.0, checkpointing=bool(saving)
    )
    run.phase("fine-tuning", f"{f.task}, at most {f.max_steps} steps" + (f", from {start}" if start else ""))
    metrics = {**fit(trainer, module, data, ckpt_path=start), **baseline}
    # the model the run leaves: the best validation's weights (early stopping's choice) ...
    module.restore_best()
    best = module.best if module.best is not None else metrics[f"{f.task}/best_{f.metric}"]
    kept = {best_name(name): value for name, value in module.best_values.items()}  # every dev metric, kept model's
    metrics.update(kept)
    metrics[f"{f.task}/best_{f.metric}"] = metrics[f"{f.task}/final_{f.metric}"] = best
    step = trainer.global_step
    if f.exits and f.exit_steps > 0:  # FastBERT: the exits learn from the final classifier
        module.self_distillation()
        exits = build_trainer(cfg, logger, [], max_steps=f.exit_steps, val_every=f.exit_steps, val_batches=0)
        run.phase("exits", f"FastBERT's self-distillation of the exits, {f.exit_steps} steps")
        fit(exits, module, data)
        step += exits.global_step
    if f.exits:
        run.phase("exit curve", f"early exit at {len(f.exit_speeds)} speeds on {data.num_validation} dev examples")
        assert isinstance(data, ClassificationDataModule), "a span task has no exits (refused by its config)"
        metrics.update(exit_curve(module.model, cfg, data, run, step))
    metrics["model_bytes"] = float(stored_bytes(module.model))  # the classifier's
    # model/ artifacts: the classifier (float weights), its config and tokenizer: a teacher, an export
    log_weights(run.client, run.run_id, module.model, cfg, tokenizer=source.tokenizer)
    done = None
    if cfg.quant.qat_steps:  # Q-BERT: the plan on the fine-tuned classifier, then QAT at its bits
        plan = planned(module.model, cfg, data, task_loss, run)
        assert plan.plan is not None  # qat_steps is checked to come with a weight-only method
        module.quantization_aware(plan.plan)
        qat_every = min(f.val_every, cfg.quant.qat_steps)
        qat = build_trainer(cfg, logger, [], max_steps=cfg.quant.qat_steps, val_every=qat_every, val_batches=1.0)
        run.phase("QAT", f"{cfg.quant.method} fake-quantized, {cfg.quant.qat_steps} steps")
        fit(qat, module, data)
        module.restore_best()  # the best validation of the quantization-aware phase
        step += qat.global_step
        done = (convert_weight_qat(copy.deepcopy(module.model), plan.plan, cfg.quant), plan)
    if cfg.quant.enabled:  # ... quantized: its dev score is scored again
        scores, plan = quantize_classifier(module, cfg, data, best, run, done)
        metrics.update(scores)
        if plan.table is not None:
            run.text(plan.table.to_csv(index=False), "quant/plan.csv")
    if cfg.trainer.measure or f.exit_at is not None:  # the classifier as it ships: timed, at its speed
        at = "" if f.exit_at is None else f", early exit at speed {f.exit_at:g}"
        run.phase("latency", f"batch-1 latency on the CPU{at}")
        if isinstance(data, SquadDataModule):  # a span task's model, on its dev windows
            metrics.update(span_latency(module.model, cfg, data))
        else:
            metrics.update(used_at(module.model, cfg, data))
    logged = (f"{f.task}/final_{f.metric}", f"{f.task}/fp32_{f.metric}", "model_bytes", "quant/avg_bits")
    keys = (*logged, f"{f.task}/latency_ms", f"{f.task}/exit_layers", *kept)
    run.log({key: metrics[key] for key in keys if key in metrics}, step=step)
    return metrics
