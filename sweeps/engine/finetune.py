"""One fine-tuning run (``finetune.source`` set): a pre-trained model on a classification, regression or span
task. :func:`prepare_finetune` checks and loads the source, the teacher and the data; :func:`finetune_plan` is
fine-tuning with early stopping, then FastBERT's exits and Q-BERT's QAT as the config says, and the finishers;
:class:`Tuned` is what its phases hand on. What the run logs and keeps: docs/guides/finetuning.md."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
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
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.quant import check_group_size
from ablate.lightning_modules.measure.accounting import stored_bytes
from ablate.lightning_modules.methods.finetune import FinetuneModule, task_distill_module
from ablate.lightning_modules.methods.finetune import task_loss as loss_of
from ablate.lightning_modules.methods.quantization.apply import check_quantizable, prepare_qat
from ablate.lightning_modules.methods.span import span_loss
from ablate.lightning_modules.methods.train_module import OptimSetup
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.span import SpanModel
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepared, RunContext
from ablate.sweeps.engine.exits import exit_curve, used_at
from ablate.sweeps.engine.inputs import task_workers
from ablate.sweeps.engine.phases import Finisher, Leaving, Metrics, Phase, RunPlan
from ablate.sweeps.engine.predictions import predictions_finisher
from ablate.sweeps.engine.quant import BitAllocation, QuantDone, after_qat, qat_plan, quantize_and_score, validate
from ablate.sweeps.engine.rescore import scoring_module
from ablate.sweeps.engine.sources import Source, check_same_tokenizer, load_classifier_source, load_source
from ablate.sweeps.engine.span import span_data, span_latency, span_module

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
    done: QuantDone | None = None,
) -> dict[str, float]:
    """``module``'s fine-tuned classifier quantized and scored (:func:`~ablate.sweeps.engine.quant.
    quantize_and_score`; its layers ranked by the task's loss) on the dev set on the CPU, beside the float
    classifier's ``fp32`` score."""
    f = cfg.finetune

    def score(quantized: nn.Module) -> dict[str, float]:
        scores = validate(scoring_module(cfg, quantized), cfg, data)  # the same dev metrics, on the quantized model
        return {
            f"{f.task}/final_{f.metric}": scores[f"{f.task}/{f.metric}"],
            f"{f.task}/fp32_{f.metric}": fp32,
            "model_bytes": float(stored_bytes(quantized)),
        }

    return quantize_and_score(module.model, cfg, data, task_loss, score, run, done)[0]


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


def check_positions(length: int, model: ModelConfig, field: str, name: str) -> None:
    """``finetune.max_length`` fits the learned positions of the model ``field`` names (``name``)."""
    if model.position == "learned" and length > model.max_position:
        raise ConfigError(
            f"finetune.max_length: {length} is more than the {model.max_position} positions of {field} "
            f"{name} (its model.max_position); at most {model.max_position}"
        )


def _module(cfg: ExperimentConfig, source: Source, uri: str, workdir: Path) -> tuple[FinetuneModule, dict[str, str]]:
    """The fine-tuning module (distilled from ``distill.teacher`` when set) and its extra tags."""
    if cfg.distill.teacher is None:
        return FinetuneModule(cfg, source.model), {}
    teacher = load_classifier_source(cfg.distill.teacher, uri, workdir / "teacher", field="distill.teacher")
    check_positions(cfg.finetune.max_length, teacher.model_cfg, "distill.teacher", cfg.distill.teacher)
    if teacher.tokenizer is not None:
        check_same_tokenizer(teacher, source.tokenizer)  # type: ignore[arg-type]
    module = task_distill_module(cfg, source.model, teacher.model, teacher.model_cfg)
    return module, {tracking.TEACHER: teacher.run_id or teacher.source}


def _task(
    cfg: ExperimentConfig, source: Source, tokenizer: Path, uri: str, workdir: Path
) -> tuple[FinetuneModule, dict[str, str], ClassificationDataModule | SquadDataModule]:
    """The fine-tuning module, its extra tags and the task's data (the augmented set made)."""
    mlm, mlm_id = _augmenter(cfg, source, uri, workdir)
    if cfg.finetune.kind == "span":  # SQuAD: its own data and module (sweeps/engine/span.py)
        return *span_module(cfg, source, uri, workdir), span_data(cfg, tokenizer)
    module, tags = _module(cfg, source, uri, workdir)
    data = ClassificationDataModule(
        cfg.finetune,
        tokenizer,
        seed=cfg.seed,
        limit_train=cfg.finetune.train_examples,
        mlm=mlm,
        cache_dir=cfg.data.cache_dir,
        mlm_id=mlm_id,
        num_workers=task_workers(cfg),
        bucketed=cfg.trainer.compile,
    )
    data.setup("fit")
    return module, tags, data


def prepare_finetune(
    cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack
) -> Prepared[FinetuneRun, Tuned]:
    """A run fine-tuning ``finetune.source`` on ``finetune.train``, prepared: the source, the teacher, the augmenting
    masked LM, their tokenizers, the task's data are checked (and the augmented set made) before the run is created."""
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
    check_positions(f.max_length, source.model_cfg, "finetune.source", f.source)
    try:
        check_group_size(cfg.quant, source.model_cfg)
    except ValueError as exc:
        raise ConfigError(f"{exc} (the model of finetune.source)") from None
    if cfg.trainer.compile:  # graphs kept under the tracking root, as pre-training keeps them
        tracking.compile_cache(cfg.tracking.root)
    module, module_tags, data = _task(cfg, source, source.tokenizer, uri, tmp)
    check_quantizable(module.model, cfg.quant, "the classifier")
    if cfg.quant.method == "qat-int8":  # fine-tuned with fake quantization (Q8BERT), converted at the end
        prepare_qat(module.model)  # in place

    def begin(run: ActiveRun, going_on: bool) -> None:
        if not going_on:  # the baselines, at step 0 (not again when the run goes on)
            run.log(baseline(cfg.finetune, data))
            if data.augment_sample is not None:
                run.text(data.augment_sample, AUGMENT_SAMPLE)

    return Prepared(
        cfg=cfg,
        materials=FinetuneRun(cfg, module, data, source.tokenizer),
        handed=Tuned(),
        data=data,
        tokenizer=source.tokenizer,
        tags={tracking.SOURCE: source.run_id or source.source, **module_tags},
        begin=begin,
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


@dataclass(frozen=True)
class FinetuneRun:
    """A fine-tuning run's materials: its module (the classifier, its teacher and exits), data and tokenizer."""

    cfg: ExperimentConfig
    module: FinetuneModule
    data: ClassificationDataModule | SquadDataModule
    tokenizer: Path | None

    def leaving(self, handed: Tuned) -> Leaving:
        return self.module.model, self.cfg, self.tokenizer


@dataclass(frozen=True)
class Tuned:
    """What a fine-tuning run's phases hand on.

    Attributes:
        best: the fine-tuning phase's best ``finetune.metric`` (the kept weights').
        kept: every dev metric at that validation, as ``<dev set>/best_<metric>``.
        qat: Q-BERT's plan (bits per layer) for the quantization-aware phase.
        done: after that phase, the classifier quantized as it trained and its plan.
    """

    best: float = float("nan")
    kept: Mapping[str, float] = field(default_factory=dict)
    qat: BitAllocation | None = None
    done: QuantDone | None = None


def baseline(f: FinetuneConfig, data: ClassificationDataModule | SquadDataModule) -> Metrics:
    """The training set's size and the majority class's accuracy (None for regression) to compare against."""
    out = {f"{f.task}/train_examples": float(data.num_train)}
    if data.majority_accuracy is not None:
        out[f"{f.task}/majority_accuracy"] = data.majority_accuracy
    return out


def _early_stopping(f: FinetuneConfig) -> Callable[[], list[Callback]]:
    def callbacks() -> list[Callback]:
        # strict=False: the dev set is not scored while an intermediate stage trains the layers
        stop = EarlyStopping(
            monitor=f"{f.task}/{f.metric}", mode="max", patience=f.patience, check_finite=True, strict=False
        )
        return [stop, StoppedEarly(stop)]

    return callbacks


def _fine_tuning(m: FinetuneRun, h: Tuned, run: ActiveRun) -> tuple[pl.LightningModule, Tuned]:
    return m.module, h


def _tuned(m: FinetuneRun, h: Tuned, module: pl.LightningModule, metrics: Metrics) -> tuple[Tuned, Metrics]:
    """The model the run leaves: the best validation's weights (early stopping's choice)."""
    f = m.cfg.finetune
    m.module.restore_best()
    best = m.module.best if m.module.best is not None else metrics[f"{f.task}/best_{f.metric}"]
    kept = {best_name(name): value for name, value in m.module.best_values.items()}
    kept[f"{f.task}/best_{f.metric}"] = best
    return replace(h, best=best, kept=kept), {}


def _exits(m: FinetuneRun, h: Tuned, run: ActiveRun) -> tuple[pl.LightningModule, Tuned]:
    m.module.self_distillation()
    return m.module, h


def _qat(m: FinetuneRun, h: Tuned, run: ActiveRun) -> tuple[pl.LightningModule, Tuned]:
    """Q-BERT: the plan on the fine-tuned classifier, then QAT at its bits."""
    plan = qat_plan(m.module.model, m.cfg, m.data, task_loss, run)
    assert plan.layers is not None
    m.module.quantization_aware(plan.layers)
    return m.module, replace(h, qat=plan)


def _after_qat(m: FinetuneRun, h: Tuned, module: pl.LightningModule, metrics: Metrics) -> tuple[Tuned, Metrics]:
    m.module.restore_best()  # the best validation of the quantization-aware phase
    return replace(h, done=after_qat(m.module.model, h.qat, m.cfg)), {}


def _exit_curve(m: FinetuneRun, h: Tuned, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    f = m.cfg.finetune
    run.phase("exit curve", f"early exit at {len(f.exit_speeds)} speeds on {m.data.num_validation} dev examples")
    assert isinstance(m.data, ClassificationDataModule), "a span task has no exits (refused by its config)"
    assert isinstance(m.module.model, Classifier)
    return exit_curve(m.module.model, m.cfg, m.data, run, step)


def _size(m: FinetuneRun, h: Tuned, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    return {"model_bytes": float(stored_bytes(m.module.model))}  # the float classifier's


def _quantized(m: FinetuneRun, h: Tuned, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """The classifier quantized as ``quant`` says, its dev score scored again (``quant/plan.csv``: its plan)."""
    return quantize_classifier(m.module, m.cfg, m.data, h.best, run, h.done)


def _latency(m: FinetuneRun, h: Tuned, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """The classifier as it ships: timed at batch 1 on the CPU (at its early-exit speed)."""
    f = m.cfg.finetune
    at = "" if f.exit_at is None else f", early exit at speed {f.exit_at:g}"
    run.phase("latency", f"batch-1 latency on the CPU{at}")
    if isinstance(m.data, SquadDataModule):  # a span task's model, on its dev windows
        assert isinstance(m.module.model, SpanModel)
        return span_latency(m.module.model, m.cfg, m.data)
    assert isinstance(m.module.model, Classifier)
    return used_at(m.module.model, m.cfg, m.data)


def _summary(m: FinetuneRun, h: Tuned, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    """The run's final values, logged at its last step: the kept model's dev metrics, its size, latency."""
    f = m.cfg.finetune
    out = {**h.kept, **baseline(f, m.data)}
    final = f"{f.task}/final_{f.metric}"  # the quantized classifier's or the early exit's where a finisher scored it
    out[final] = metrics.get(final, h.best)
    merged = {**metrics, **out}
    logged = (f"{f.task}/final_{f.metric}", f"{f.task}/fp32_{f.metric}", "model_bytes", "quant/avg_bits")
    keys = (*logged, f"{f.task}/latency_ms", f"{f.task}/exit_layers", *h.kept)
    run.log({key: merged[key] for key in keys if key in merged}, step=step)
    return out


def finetune_plan(cfg: ExperimentConfig) -> RunPlan[FinetuneRun, Tuned]:
    """Fine-tuning with early stopping (a task distillation's stages in its schedule), then FastBERT's
    self-distillation of the exits and Q-BERT's quantization-aware phase as the config says; the exit
    curve, the quantized classifier scored again, the latency, the summary and the predictions."""
    f, q = cfg.finetune, cfg.quant
    teacher = "" if cfg.distill.teacher is None else f", distilled from distill.teacher ({cfg.distill.strategy})"
    detail = f"{f.task}{teacher}, early stopping on {f.task}/{f.metric}"
    how = "new module (the source's encoder, a new classifier)"
    optim = OptimSetup.task(cfg, f.max_steps).describe()
    phases: list[Phase[FinetuneRun, Tuned]] = [
        Phase(
            "fine-tuning",
            f.max_steps,
            _fine_tuning,
            how,
            detail,
            callbacks=_early_stopping(f),
            val_every=f.val_every,
            within_epoch=True,
            val_batches=1.0,
            monitor=None,
            optim=optim,
            ended=_tuned,
        ),
    ]
    if f.exits and f.exit_steps > 0:  # FastBERT: the exits learn from the final classifier
        how, optim = "same module, new stages (only the exits train)", OptimSetup.task(cfg, f.exit_steps).describe()
        phases.append(
            Phase(
                "exits",
                f.exit_steps,
                _exits,
                how,
                "FastBERT's self-distillation",
                callbacks=list,
                val_every=f.exit_steps,
                val_batches=0,
                monitor=None,
                optim=optim,
            )
        )
    if q.qat_steps:
        how = "same module, new stages (fake-quantized at the plan's bits)"
        optim = OptimSetup.task(cfg, q.qat_steps).describe()
        phases.append(
            Phase(
                "QAT",
                q.qat_steps,
                _qat,
                how,
                q.method,
                callbacks=list,
                val_every=min(f.val_every, q.qat_steps),
                val_batches=1.0,
                monitor=None,
                optim=optim,
                ended=_after_qat,
            )
        )
    return RunPlan(phases, _finishers(cfg))


def _finishers(cfg: ExperimentConfig) -> list[Finisher[FinetuneRun, Tuned]]:
    """The exit curve, size, quantized score, latency, summary and predictions, as ``cfg`` asks."""
    f, q = cfg.finetune, cfg.quant
    finishers: list[Finisher[FinetuneRun, Tuned]] = []
    if f.exits:
        finishers.append(
            Finisher("exit curve", f"early exit at {len(f.exit_speeds)} speeds on the dev set", _exit_curve)
        )
    finishers.append(Finisher("size", "the float classifier's stored bytes", _size))
    if q.enabled:
        finishers.append(Finisher("quantize and score", f"{q.method}, the dev set on the CPU", _quantized))
    if cfg.trainer.measure or f.exit_at is not None:
        finishers.append(Finisher("latency", "batch-1 latency on the CPU", _latency))
    finishers.append(Finisher("summary", "the kept model's dev metrics, logged at the last step", _summary))
    finishers.append(predictions_finisher(f))
    return finishers
