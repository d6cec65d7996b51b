"""One training run: data, model, Lightning Trainer, MLflow run. Used by ``ablate train`` and by sweeps."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import MLFlowLogger

from ablate.datamodules.pretrain import PretrainDataModule, probe_streams
from ablate.lightning_modules.accounting import MEASURED_ON, metric_counts  # noqa: F401 - MEASURED_ON: re-exported
from ablate.lightning_modules.config import ExperimentConfig
from ablate.lightning_modules.errors import ConfigError
from ablate.lightning_modules.interop import initial_model
from ablate.lightning_modules.pretrain import PretrainModule, distill_module
from ablate.lightning_modules.probe import intrinsic_eval
from ablate.lightning_modules.profiling import placed, training_device
from ablate.lightning_modules.pruning.gates import check_supported
from ablate.lightning_modules.quant_config import check_group_size
from ablate.lightning_modules.quantization.apply import prepare_qat
from ablate.sweeps import checkpoints, forksafe, tracking  # noqa: F401 - forksafe: pools across DDP fork
from ablate.sweeps.finetune_run import finetune
from ablate.sweeps.prune_run import prune_train
from ablate.sweeps.quant_run import quant_train, quantize_and_log
from ablate.sweeps.trainer import ValidateAtEnd, build_trainer, fit
from ablate.sweeps.weights import (
    Source,
    check_positions,
    check_same_tokenizer,
    load_source,
    log_weights,
    student_vocabulary,
)

# short names for run names: "E=64 sharing=all F=1 seed=0"
RESUMED = "ablate.resumed_from"  # on a run that continued a killed attempt: its checkpoint and step

SHORT = {
    "model.embed_dim": "E",
    "model.hidden_dim": "H",
    "model.num_layers": "L",
    "model.num_heads": "A",
    "model.num_ffn": "F",
    "model.ffn_dim": "ffn",
}


def run_name(changes: dict[str, object]) -> str:
    """A run name saying what the run changes, e.g. ``E=64 sharing=all seed=1``."""
    return " ".join(f"{SHORT.get(k, k.rsplit('.', 1)[-1])}={v}" for k, v in changes.items()) or "run"


def build_module(cfg: ExperimentConfig, uri: str, tokenizer: Path) -> tuple[PretrainModule, dict[str, str]]:
    """The LightningModule of a run and its extra tags: pre-training, distilled from the teacher in a
    ``distill`` run (tagged with the teacher's run); the model starts from random
    weights or from those of ``init_from``."""
    student = initial_model(cfg, tokenizer)
    if cfg.quant.method == "qat-int8":  # fake-quantized from the first step
        student = prepare_qat(student)
    if cfg.regime != "distill":
        return PretrainModule(cfg, student), {}
    with tempfile.TemporaryDirectory(prefix="ablate-teacher-") as tmp:
        teacher = load_source(cfg.distill.teacher, uri, Path(tmp))
        vocab = student_vocabulary(teacher, tokenizer, cfg.model)  # None: the teacher's own (checked)
    module = distill_module(cfg, teacher.model, teacher.model_cfg, student, vocab)
    return module, {tracking.TEACHER: teacher.run_id or teacher.source}


def vocabulary_metrics(module: PretrainModule) -> dict[str, float]:
    """A student with its own vocabulary: the share of its tokens that have a teacher counterpart
    (``distill/vocab_coverage``, logged at step 0 with the parameter counts)."""
    bridge = module.link.vocab if module.link is not None else None
    return {} if bridge is None else {"distill/vocab_coverage": bridge.coverage}


def checked_source(cfg: ExperimentConfig, field: str, uri: str, tokenizer: Path) -> Source:
    """The model ``field`` (``prune.source``, ``quant.source``) names, loaded and checked against this
    run's tokenizer and sequence length, before the run exists."""
    section, key = field.split(".")
    with tempfile.TemporaryDirectory(prefix="ablate-source-") as tmp:
        source = load_source(getattr(getattr(cfg, section), key), uri, Path(tmp), field=field)
        check_same_tokenizer(source, tokenizer, field=field)
        check_positions(source, cfg.data.max_length, field=field)
    try:
        check_group_size(cfg.quant, source.model_cfg)
    except ValueError as exc:
        raise ConfigError(f"{exc} (the model of {field})") from None
    return source


def _fit_run(
    module: PretrainModule,
    cfg: ExperimentConfig,
    data: PretrainDataModule,
    uri: str,
    client: Any,
    run_id: str,
    callbacks: list[Callback],
    checkpoint: checkpoints.Plan | None = None,
    resume: str | bool = False,
) -> dict[str, float]:
    """Fit ``module`` inside run ``run_id``, keeping checkpoints as ``checkpoint`` says and
    resuming from ``resume`` (a ``last.ckpt``; True: whatever an earlier attempt at this config
    left), then log its weights; the final metrics."""
    logger = MLFlowLogger(tracking_uri=uri, run_id=run_id, log_model=False, synchronous=False)  # no wait on the store
    plan = None if checkpoint is None else checkpoint.for_run(run_id)
    start = checkpoints.resume_path(plan, client, run_id) if resume is True else resume or None
    saving = (
        []
        if plan is None
        else checkpoints.callbacks(
            plan, client, run_id, on_resume=lambda step: client.set_tag(run_id, RESUMED, f"{start} (step {step})")
        )
    )
    trainer = build_trainer(cfg, logger, [ValidateAtEnd(), *callbacks, *saving], checkpointing=bool(saving))
    metrics = fit(trainer, module, data, ckpt_path=start)
    if start and not any(k.startswith("val/") for k in metrics):
        # resumed from the checkpoint of a finished training (a retried trial whose later stage failed):
        # nothing trained, nothing validated; the run still logs its final validation, as the first did
        (scores,) = trainer.validate(module, datamodule=data, verbose=False)
        for key, value in scores.items():
            client.log_metric(run_id, key, float(value), step=trainer.global_step)
        metrics.update({k: float(v) for k, v in scores.items()})
    for callback in callbacks:  # under DDP a rank's prune reaches this process through the trial
        check_pruned = getattr(callback, "check_pruned", None)  # optuna-integration's documented call
        if check_pruned is not None:
            check_pruned()
    if cfg.trainer.intrinsic:  # the same probes for every model, whatever its own objective
        # eager, on the training device (Lightning hands the model back on the CPU after fit)
        with placed(module.model, training_device(cfg.trainer.accelerator), train=False):
            streams = probe_streams(cfg.data, cfg.model.vocab_size, seed=cfg.seed)
            scores = intrinsic_eval(module.model, streams, seed=cfg.seed).as_metrics()
        step = trainer.global_step or cfg.trainer.max_steps  # forked DDP ranks do not send their step back
        for key, value in scores.items():
            client.log_metric(run_id, key, value, step=step)
        metrics.update(scores)
    if cfg.quant.enabled:  # the trained model, quantized: its metrics become the run's
        metrics.update(quantize_and_log(module.model, cfg, data, client, run_id, trainer.global_step, metrics))
    # model/ artifacts (weights, config, tokenizer): what `ablate export RUN` reads
    log_weights(client, run_id, module.model, cfg, tokenizer=data.tokenizer_path)
    return metrics


def train(
    cfg: ExperimentConfig,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    name: str | None = None,
    callbacks: list[Callback] | None = None,
    extra_params: dict[str, str] | None = None,
    checkpoint: checkpoints.Plan | None = None,
    resume: str | bool = False,
) -> tracking.RunResult:
    """Train ``cfg`` as one MLflow run, as its ``regime`` says (pre-training, distillation, pruning
    or fine-tuning); return its final metrics.

    With a ``checkpoint`` plan, pre-training and distillation keep their last and best
    checkpoints where it says; ``resume`` is a ``last.ckpt`` to start from, or True: the last one
    an earlier attempt at the same config left (a study trial's retry).

    Corpus, store, teacher and source problems raise before the MLflow run is created. Any
    failure marks the run FAILED; Ctrl-C marks it KILLED and re-raises KeyboardInterrupt.
    A ``finetune`` run is :func:`ablate.sweeps.finetune_run.finetune`.
    """
    if cfg.regime == "finetune":
        return finetune(
            cfg,
            tracking_uri=tracking_uri,
            experiment=experiment,
            parent_run_id=parent_run_id,
            tags=tags,
            name=name,
            extra_params=extra_params,
        )
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    data = PretrainDataModule(
        cfg.data, cfg.objective, cfg.model.vocab_size, cfg.seed, val_batches=cfg.trainer.val_batches
    )
    data.prepare_data()
    data.setup("fit")
    uri = tracking.resolve_tracking_uri(tracking_uri or cfg.tracking.tracking_uri, cfg.tracking.root)
    tokenizer = Path(data.tokenizer_path)
    if cfg.regime == "quant":
        source = checked_source(cfg, "quant.source", uri, tokenizer)
        cfg = replace(cfg, model=source.model_cfg)  # the source's architecture, logged as the run's
        inputs, measured_on = metric_counts(source.model, cfg.model, cfg)
        module_tags = {tracking.SOURCE: source.run_id or source.source}
        extra_params = {**measured_on, **(extra_params or {})}

        def work(client: Any, run_id: str) -> dict[str, float]:
            return quant_train(cfg, source, data, uri, client, run_id)
    elif cfg.regime != "prune":
        module, module_tags = build_module(cfg, uri, tokenizer)
        cfg = module.cfg  # a distillation's: distill.mix_prob and dual_weight resolved against its teacher
        inputs, measured_on = metric_counts(module.model, cfg.model, cfg)
        inputs = {**inputs, **vocabulary_metrics(module)}
        extra_params = {**measured_on, **(extra_params or {})}

        def work(client: Any, run_id: str) -> dict[str, float]:
            return _fit_run(module, cfg, data, uri, client, run_id, callbacks or [], checkpoint, resume)
    else:
        source = checked_source(cfg, "prune.source", uri, tokenizer)
        try:  # a source that layer surgery cannot shrink (shared layers ...) fails before the run exists
            if cfg.prune.method != "fewer-layers":  # which only drops whole layers
                check_supported(source.model_cfg)
        except ConfigError as exc:
            raise ConfigError(f"prune.source: {exc}") from None
        module_tags, inputs = {tracking.SOURCE: source.run_id or source.source}, {}

        def work(client: Any, run_id: str) -> dict[str, float]:
            return prune_train(cfg, source, data, uri, client, run_id)

    return tracking.tracked_run(
        cfg,
        uri,
        work,
        experiment=experiment,
        name=name,
        parent_run_id=parent_run_id,
        tags={**module_tags, **(tags or {})},
        inputs=inputs,
        tokenizer=tokenizer,
        extra_params=extra_params,
    )
