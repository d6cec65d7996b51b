"""One training run: data, model, Lightning Trainer, MLflow run. Used by ``ablate train`` and by sweeps."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import cast

import lightning.pytorch as pl

from ablate.datamodules.catalog import resolve_model
from ablate.datamodules.pretrain import PretrainDataModule, probe_streams
from ablate.datamodules.tokenizer import checkpoint_tokenizer, run_vocab_size
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig, Regime
from ablate.lightning_modules.config.quant import check_group_size
from ablate.lightning_modules.interop.export import same_vocabulary
from ablate.lightning_modules.interop.pretrained import different_tokenizer, initial_model
from ablate.lightning_modules.measure.accounting import MEASURED_ON as MEASURED_ON  # re-exported
from ablate.lightning_modules.measure.accounting import (
    metric_counts as metric_counts,  # re-exported: benchmarks wrap it
)
from ablate.lightning_modules.measure.measuring import placed, training_device
from ablate.lightning_modules.methods.precision import matmul_precision, resolved
from ablate.lightning_modules.methods.pretrain import PretrainModule, distill_module
from ablate.lightning_modules.methods.probe import intrinsic_eval
from ablate.lightning_modules.methods.pruning.gates import check_supported
from ablate.lightning_modules.methods.quantization.apply import prepare_qat
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepare, Prepared, RunContext, RunResult, tracked_run
from ablate.sweeps.engine.finetune import prepare_finetune
from ablate.sweeps.engine.prune import prune_train
from ablate.sweeps.engine.quant import quant_train, quantize_and_log
from ablate.sweeps.engine.trainer import ValidateAtEnd, build_trainer, fit, run_logger
from ablate.sweeps.engine.weights import (
    Source,
    check_positions,
    check_same_tokenizer,
    load_source,
    log_weights,
    student_vocabulary,
)

RESUMED = tracking.RESUMED  # re-exported: tests and tools read the tag by this name
MATMUL_PRECISION = "measure.matmul_precision"  # param: the fp32 matmul precision the run trained and was timed at

SHORT = {
    "model.embed_dim": "E",
    "model.hidden_dim": "H",
    "model.num_layers": "L",
    "model.num_heads": "A",
    "model.num_ffn": "F",
    "model.ffn_dim": "ffn",
}
"""Short names for run names: ``E=64 sharing=all F=1 seed=0``."""
PHASES: Mapping[Regime, str] = {"pretrain": "pre-training", "distill": "distillation", "quant": "QAT"}
"""The name of a fit's phase, by its regime, in status lines and the ``ablate.phase`` tag."""


def run_name(changes: dict[str, object]) -> str:
    """A run name saying what the run changes, e.g. ``E=64 sharing=all seed=1``."""
    return " ".join(f"{SHORT.get(k, k.rsplit('.', 1)[-1])}={v}" for k, v in changes.items()) or "run"


def _corpus(cfg: ExperimentConfig) -> PretrainDataModule:
    """The run's corpus stream, tokenizer trained or read from the cache, ready to fit."""
    data = PretrainDataModule(
        cfg.data, cfg.objective, run_vocab_size(cfg), cfg.seed, val_batches=cfg.trainer.val_batches
    )
    data.prepare_data()
    data.setup("fit")
    return data


def _student(cfg: ExperimentConfig, tokenizer: Path) -> PretrainingModel | None:
    """The model a pre-training or distillation run trains: ``init_from``'s weights (None: the module
    builds it from random weights), fake-quantized from the first step with ``quant.method: qat-int8``."""
    student = initial_model(cfg, tokenizer, _init_folder(cfg, tokenizer))
    if cfg.quant.method != "qat-int8":
        return student
    model = student if student is not None else build_pretraining_model(cfg.model, cfg.objective)
    return cast(PretrainingModel, prepare_qat(model))  # prepared in place: the same model


def _init_folder(cfg: ExperimentConfig, tokenizer: Path) -> Path | None:
    """Where ``init_from`` (a folder, the data catalog's model entry or a hub name) is, its tokenizer
    (``tokenizer.json`` or ``vocab.txt``) checked to be the run's; None without ``init_from``."""
    if cfg.init_from is None:
        return None
    folder = resolve_model(cfg.init_from, "init_from")
    with tempfile.TemporaryDirectory(prefix="ablate-init-") as tmp:
        theirs = checkpoint_tokenizer(folder, Path(tmp))
        if theirs is not None and not same_vocabulary(theirs, tokenizer):
            raise ConfigError(different_tokenizer("init_from", cfg.init_from))
    return folder


def _tokenizer(data: PretrainDataModule) -> Path:
    """The tokenizer file ``data`` trained or read (set up by :func:`_corpus`)."""
    assert data.tokenizer_path is not None, "the data module is set up"
    return Path(data.tokenizer_path)


def vocabulary_metrics(module: PretrainModule) -> dict[str, float]:
    """A student with its own vocabulary: the share of its tokens that have a teacher counterpart
    (``distill/vocab_coverage``, logged at step 0 with the parameter counts)."""
    bridge = module.link.vocab if module.link is not None else None
    return {} if bridge is None else {"distill/vocab_coverage": bridge.coverage}


def checked_source(cfg: ExperimentConfig, name: str, field: str, uri: str, tokenizer: Path) -> Source:
    """The model ``name`` (the value of config field ``field``: ``prune.source``, ``quant.source``),
    loaded and checked against this run's tokenizer and sequence length, before the run exists."""
    with tempfile.TemporaryDirectory(prefix="ablate-source-") as tmp:
        source = load_source(name, uri, Path(tmp), field=field)
        check_same_tokenizer(source, tokenizer, field=field)
        check_positions(source, cfg.data.max_length, field=field)
    try:
        check_group_size(cfg.quant, source.model_cfg)
    except ValueError as exc:
        raise ConfigError(f"{exc} (the model of {field})") from None
    return source


def _fitted(module: PretrainModule, data: PretrainDataModule, ctx: RunContext, tags: dict[str, str]) -> Prepared:
    """A pre-training module fitted in the run: its counts and latency measured first."""
    cfg = module.cfg  # a distillation's: distill.mix_prob and dual_weight resolved against its teacher
    inputs, measured_on = metric_counts(module.model, cfg.model, cfg)
    return Prepared(
        cfg=cfg,
        work=lambda run: _fit_run(module, cfg, data, run, ctx),
        tokenizer=_tokenizer(data),
        tags=tags,
        inputs={**inputs, **vocabulary_metrics(module)},
        params=measured_on,
    )


def _pretrain(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared:
    """Pre-training (MLM, and SOP/NSP when set) from random weights or ``init_from``."""
    data = _corpus(cfg)
    return _fitted(PretrainModule(cfg, _student(cfg, _tokenizer(data))), data, ctx, {})


def _distill(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared:
    """Pre-training distillation from ``distill.teacher``, tagged with the teacher's run."""
    data = _corpus(cfg)
    tokenizer = _tokenizer(data)
    student = _student(cfg, tokenizer)
    with tempfile.TemporaryDirectory(prefix="ablate-teacher-") as tmp:
        teacher = load_source(cfg.distill.teacher, uri, Path(tmp))  # type: ignore[arg-type]  # set in distill
        vocab = student_vocabulary(teacher, tokenizer, cfg.model)  # None: the teacher's own (checked)
    module = distill_module(cfg, teacher.model, teacher.model_cfg, student, vocab)
    return _fitted(module, data, ctx, {tracking.TEACHER: teacher.run_id or teacher.source})


def _prune(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared:
    """Pruning ``prune.source`` as ``prune.method`` says."""
    data = _corpus(cfg)
    tokenizer = _tokenizer(data)
    source = checked_source(cfg, cfg.prune.source, "prune.source", uri, tokenizer)  # type: ignore[arg-type]
    try:  # a source that layer surgery cannot shrink (shared layers ...) fails before the run exists
        if cfg.prune.method != "fewer-layers":  # which only drops whole layers
            check_supported(source.model_cfg)
    except ConfigError as exc:
        raise ConfigError(f"prune.source: {exc}") from None
    return Prepared(
        cfg=cfg,
        work=lambda run: prune_train(cfg, source, data, run),
        tokenizer=tokenizer,
        tags={tracking.SOURCE: source.run_id or source.source},
    )


def _quant(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared:
    """Quantizing ``quant.source`` (trained with fake quantization first for ``qat-int8``)."""
    data = _corpus(cfg)
    tokenizer = _tokenizer(data)
    source = checked_source(cfg, cfg.quant.source, "quant.source", uri, tokenizer)  # type: ignore[arg-type]
    cfg = replace(cfg, model=source.model_cfg)  # the source's architecture, logged as the run's
    inputs, measured_on = metric_counts(source.model, cfg.model, cfg)
    return Prepared(
        cfg=cfg,
        work=lambda run: quant_train(cfg, source, data, run),
        tokenizer=tokenizer,
        tags={tracking.SOURCE: source.run_id or source.source},
        inputs=inputs,
        params=measured_on,
    )


REGIMES: Mapping[Regime, Prepare] = {
    "pretrain": _pretrain,
    "distill": _distill,
    "prune": _prune,
    "quant": _quant,
    "finetune": prepare_finetune,
}
"""What runs each regime: its preparation, which checks and loads everything before the run exists."""


def _fit_run(
    module: PretrainModule, cfg: ExperimentConfig, data: PretrainDataModule, run: ActiveRun, ctx: RunContext
) -> dict[str, float]:
    """Fit ``module`` inside ``run``, keeping checkpoints as ``ctx.checkpoint`` says and resuming
    from ``ctx.resume`` (a ``last.ckpt``; True: whatever an earlier attempt at this config left),
    then log its weights; the final metrics."""
    client, run_id = run.client, run.run_id
    logger = run_logger(run.uri, run_id, synchronous=False)  # no wait
    start, saving = ctx.checkpointing(run, "val/loss")
    callbacks = list(ctx.callbacks)
    trainer = build_trainer(cfg, logger, [ValidateAtEnd(), *callbacks, *saving], checkpointing=bool(saving))
    run.phase(PHASES[cfg.regime or "pretrain"], f"{cfg.trainer.max_steps} steps" + (f", from {start}" if start else ""))
    metrics = fit(trainer, module, data, ckpt_path=start)
    if start and not any(k.startswith("val/") for k in metrics):
        # resumed from the checkpoint of a finished training (a retried trial whose later stage failed):
        # nothing trained, nothing validated; the run still logs its final validation, as the first did
        (scores,) = trainer.validate(module, datamodule=data, verbose=False)
        run.log({k: float(v) for k, v in scores.items()}, step=trainer.global_step)
        metrics.update({k: float(v) for k, v in scores.items()})
    for callback in callbacks:  # under DDP a rank's prune reaches this process through the trial
        check_pruned = getattr(callback, "check_pruned", None)  # optuna-integration's documented call
        if check_pruned is not None:
            check_pruned()
    if cfg.trainer.intrinsic:  # the same probes for every model, whatever its own objective
        # eager, on the training device (Lightning hands the model back on the CPU after fit)
        run.phase("probes", "MLM, NSP and SOP probes on the frozen encoder")
        with placed(module.model, training_device(cfg.trainer.accelerator), train=False):
            streams = probe_streams(cfg.data, cfg.model.vocab_size, seed=cfg.seed)
            scores = intrinsic_eval(module.model, streams, seed=cfg.seed).as_metrics()
        # forked DDP ranks do not send their step back
        run.log(scores, step=trainer.global_step or cfg.trainer.max_steps)
        metrics.update(scores)
    if cfg.quant.enabled:  # the trained model, quantized: its metrics become the run's
        metrics.update(quantize_and_log(module.model, cfg, data, run, trainer.global_step, metrics))
    # model/ artifacts (weights, config, tokenizer): what `ablate export RUN` reads
    log_weights(client, run_id, module.model, cfg, tokenizer=data.tokenizer_path)
    return metrics


def train(cfg: ExperimentConfig, ctx: RunContext = RunContext()) -> RunResult:  # noqa: B008 - frozen
    """Train ``cfg`` as one MLflow run placed as ``ctx`` says, as its ``regime`` says (the
    :data:`REGIMES` table: pre-training, distillation, pruning, quantization or fine-tuning);
    return its final metrics.

    With ``ctx.checkpoint``, pre-training and distillation keep their last and best checkpoints
    where it says; ``ctx.resume`` is a ``last.ckpt`` to start from, or True: the last one an
    earlier attempt at the same config left (a study trial's retry). The run's fp32 matmul
    precision (``trainer.matmul_precision``) holds from its preparation (latency is measured
    there) to its end, and the process's own is restored after.

    Corpus, store, teacher and source problems raise before the MLflow run is created. The run is
    RUNNING until its last phase, evaluation and artifact are done; any failure marks it FAILED, a
    signal (SIGINT, SIGTERM) KILLED, re-raised as :class:`~ablate.sweeps.engine.interrupt.Interrupted`.
    """
    assert cfg.regime is not None  # resolved by the config's validation
    uri = tracking.resolve_tracking_uri(ctx.tracking_uri or cfg.tracking.tracking_uri, cfg.tracking.root)
    precision = resolved(cfg.trainer.matmul_precision, training_device(cfg.trainer.accelerator).type)
    with ExitStack() as stack, matmul_precision(precision):
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        ready = REGIMES[cfg.regime](cfg, ctx, uri, stack)
        return tracked_run(
            ready.cfg,
            uri,
            ready.work,
            ctx,
            tags=ready.tags,
            inputs=ready.inputs,
            tokenizer=ready.tokenizer,
            params={**ready.params, MATMUL_PRECISION: precision},
        )
