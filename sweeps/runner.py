"""One training run: data, model, Lightning Trainer, MLflow run. Used by ``ablate train`` and by sweeps."""

from __future__ import annotations

import builtins
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.multiprocessing import ProcessRaisedException
from optuna import TrialPruned
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.strategies import DDPStrategy, Strategy

from datamodules.pretrain import PretrainDataModule
from lightning_modules.accounting import param_report
from lightning_modules.config import ExperimentConfig, TrainerConfig
from lightning_modules.heads import PretrainingModel
from lightning_modules.distill import DistillModule
from lightning_modules.pretrain import PretrainModule
from lightning_modules.probe import intrinsic_eval
from lightning_modules.interop import initial_model
from lightning_modules.loop import loop_callbacks
from lightning_modules.profiling import measure, placed, training_device
from sweeps import checkpoints, forksafe, tracking  # noqa: F401 - forksafe: pools across DDP fork
from sweeps.prune_run import prune_train
from sweeps.weights import check_same_tokenizer, load_source, log_weights

# short names for run names: "E=64 sharing=all F=1 seed=0"
RESUMED = "ablate.resumed_from"  # on a run that continued a killed attempt: its checkpoint and step

SHORT = {"model.embed_dim": "E", "model.hidden_dim": "H", "model.num_layers": "L", "model.num_heads": "A",
         "model.num_ffn": "F", "model.ffn_dim": "ffn"}


def run_name(changes: dict[str, object]) -> str:
    """A run name saying what the run changes, e.g. ``E=64 sharing=all seed=1``."""
    return " ".join(f"{SHORT.get(k, k.rsplit('.', 1)[-1])}={v}" for k, v in changes.items()) or "run"


@dataclass
class RunResult:
    """What a finished run produced."""

    run_id: str
    tracking_uri: str
    metrics: dict[str, float] = field(default_factory=dict)


class _ValidateAtEnd(Callback):
    """Validate after the last step when ``max_steps`` is not a multiple of ``val_every``."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step % trainer.val_check_batch and not trainer.interrupted:
            trainer.validate_loop.verbose = False  # no results table: the progress bar shows them
            trainer.validate_loop.run()


def lightning_strategy(t: TrainerConfig) -> str | Strategy:
    """The Lightning strategy for ``trainer.strategy`` and ``trainer.devices``.

    Lightning's own ``ddp`` starts the other ranks by running the command line again, which
    here would start a second MLflow run (or a second sweep worker). ablate's ``ddp`` (and
    ``auto`` on several devices) instead forks the ranks at ``fit`` (spawns them once CUDA
    is initialised, which cannot be forked): only training runs in the ranks, and the run,
    the trial and the metrics stay in the one process that started them.
    """
    if t.devices == 1 or t.strategy not in ("auto", "ddp"):
        return t.strategy
    return DDPStrategy(start_method="spawn" if torch.cuda.is_initialized() else "fork")


def rank_error(exc: ProcessRaisedException) -> Exception:
    """The error a DDP rank raised, rebuilt in this process from the traceback torch passes on:
    its own type when it is a builtin one (the NaN guard's ``FloatingPointError``), else a
    RuntimeError carrying its last line."""
    last = str(exc).strip().splitlines()[-1]
    name, _, message = last.partition(": ")
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(message)
    return RuntimeError(f"a DDP rank failed: {last}")


def build_trainer(cfg: ExperimentConfig, logger: MLFlowLogger | None, callbacks: list[Callback],
                  checkpointing: bool = False) -> pl.Trainer:
    """A Lightning Trainer from the config (checkpoints only when ``callbacks`` bring a ModelCheckpoint)."""
    t = cfg.trainer
    val_every = min(t.val_every, t.max_steps)
    extra: list[Callback] = [LearningRateMonitor(logging_interval="step")] if logger else []
    extra += loop_callbacks(t)
    return pl.Trainer(
        max_steps=t.max_steps, val_check_interval=val_every, check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches, num_sanity_val_steps=0, gradient_clip_val=cfg.optim.grad_clip or None,
        precision=t.precision, accelerator=t.accelerator, devices=t.devices, strategy=lightning_strategy(t),
        logger=logger or False, callbacks=[*extra, *callbacks], enable_checkpointing=checkpointing,
        enable_progress_bar=t.progress, enable_model_summary=False, log_every_n_steps=t.log_every,
        deterministic=False,
    )


def build_module(cfg: ExperimentConfig, uri: str, tokenizer: Path) -> tuple[PretrainModule, dict[str, str]]:
    """The LightningModule of a run and its extra tags: a DistillModule when ``distill.teacher``
    is set (tagged with the teacher's run), else a PretrainModule; the model starts from random
    weights or from those of ``init_from``."""
    student = initial_model(cfg)
    if cfg.distill.teacher is None:
        return PretrainModule(cfg, student), {}
    with tempfile.TemporaryDirectory(prefix="ablate-teacher-") as tmp:
        teacher = load_source(cfg.distill.teacher, uri, Path(tmp))
        check_same_tokenizer(teacher, tokenizer)
    module = DistillModule(cfg, teacher.model, teacher.model_cfg, student)
    return module, {tracking.TEACHER: teacher.run_id or teacher.source}


MEASURED_ON = "measure.device"  # param: where latency and activation memory were measured


def _metric_counts(model: PretrainingModel, cfg: ExperimentConfig) -> tuple[dict[str, float], dict[str, str]]:
    """Parameter counts, FLOPs/token and (unless ``trainer.measure`` is off) measured latency and
    memory; and the params saying where they were measured (``measure.device``).

    Latency (batch 1 and 32, T = ``data.max_length``) and one training step's activation memory
    (at ``data.batch_size``) are measured on the device the run trains on, resolved from
    ``trainer.accelerator`` as Lightning resolves it (``auto`` = CUDA when available: ``cuda:0``,
    rank 0's), under the run's precision (``bf16-mixed``: the same autocast), eager, before the
    Trainer places the model (it is moved back, and the CPU and CUDA random streams are forked:
    a measured run trains exactly as an unmeasured one). On CUDA this initialises CUDA in this
    process, so a multi-GPU run then starts its DDP ranks by spawn (:func:`lightning_strategy`).
    """
    counts = param_report(model, cfg.model, cfg.data.max_length)
    out = {f"params.{k}": v for k, v in counts.as_dict().items() if k not in ("flops_per_token", "seq_len")}
    out["flops_per_token"] = counts.flops_per_token
    if not cfg.trainer.measure:
        return out, {}
    device = training_device(cfg.trainer.accelerator)
    measured = measure(model, cfg.model.vocab_size, cfg.data.max_length, device=device, repeats=5, warmup=1,
                       memory_batch=cfg.data.batch_size, precision=cfg.trainer.precision)
    out.update({k: v for k, v in measured.as_dict().items() if k != "device"})
    return out, {MEASURED_ON: measured.device}


def _fit_run(module: PretrainModule, cfg: ExperimentConfig, data: PretrainDataModule, uri: str, client: Any,
             run_id: str, callbacks: list[Callback], checkpoint_dir: Path | None = None) -> dict[str, float]:
    """Fit ``module`` inside run ``run_id`` (resuming from ``checkpoint_dir/last.ckpt`` when an
    earlier attempt left one), then log its weights; the final metrics."""
    logger = MLFlowLogger(tracking_uri=uri, run_id=run_id, log_model=False, synchronous=False)  # no wait on the store
    resume = checkpoints.resume_path(checkpoint_dir)
    saving = [] if checkpoint_dir is None else checkpoints.callbacks(
        checkpoint_dir, on_resume=lambda step: client.set_tag(run_id, RESUMED, f"{resume} (step {step})"))
    trainer = build_trainer(cfg, logger, [_ValidateAtEnd(), *callbacks, *saving], checkpointing=bool(saving))
    with tracking.scoped_tracking_uri():
        try:
            trainer.fit(module, datamodule=data, ckpt_path=resume)
        except ProcessRaisedException as exc:  # a forked DDP rank failed: its own error, not the wrapper
            raise rank_error(exc) from None
    if trainer.interrupted:
        raise KeyboardInterrupt
    for callback in callbacks:  # under DDP a rank's prune reaches this process through the trial
        check_pruned = getattr(callback, "check_pruned", None)  # optuna-integration's documented call
        if check_pruned is not None:
            check_pruned()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if cfg.trainer.intrinsic:  # the same probes for every model, whatever its own objective
        # eager, on the training device (Lightning hands the model back on the CPU after fit)
        with placed(module.model, training_device(cfg.trainer.accelerator), train=False):
            scores = intrinsic_eval(module.model, cfg.data, cfg.model.vocab_size, seed=cfg.seed).as_metrics()
        step = trainer.global_step or cfg.trainer.max_steps  # forked DDP ranks do not send their step back
        for key, value in scores.items():
            client.log_metric(run_id, key, value, step=step)
        metrics.update(scores)
    log_weights(client, run_id, module.model, cfg)  # model/ artifacts: what `ablate export RUN` reads
    return metrics


def train(cfg: ExperimentConfig, *, tracking_uri: str | None = None, experiment: str | None = None,
          parent_run_id: str | None = None, tags: dict[str, str] | None = None, name: str | None = None,
          callbacks: list[Callback] | None = None, extra_params: dict[str, str] | None = None,
          checkpoint_dir: Path | None = None) -> RunResult:
    """Train ``cfg`` as one MLflow run (pre-training, distillation or pruning); return its final metrics.

    With ``checkpoint_dir`` (a study trial's), pre-training and distillation keep their last and
    best checkpoints there and resume from the last one if an earlier attempt left it.

    Corpus, store, teacher and source problems raise before the MLflow run is created. Any
    failure marks the run FAILED; Ctrl-C marks it KILLED and re-raises KeyboardInterrupt.
    A config with ``finetune.source`` fine-tunes (:func:`sweeps.finetune_run.finetune`).
    """
    if cfg.finetune.source is not None:
        from sweeps.finetune_run import finetune

        return finetune(cfg, tracking_uri=tracking_uri, experiment=experiment, parent_run_id=parent_run_id,
                        tags=tags, name=name, extra_params=extra_params)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    data = PretrainDataModule(cfg.data, cfg.objective, cfg.model.vocab_size, cfg.seed,
                              val_batches=cfg.trainer.val_batches)
    data.prepare_data()
    data.setup("fit")
    uri = tracking.resolve_tracking_uri(tracking_uri or cfg.tracking.tracking_uri, cfg.tracking.root)
    tokenizer = Path(data.tokenizer_path)
    if cfg.prune.source is None:
        module, module_tags = build_module(cfg, uri, tokenizer)
        inputs, measured_on = _metric_counts(module.model, cfg)
        extra_params = {**measured_on, **(extra_params or {})}

        def work(client: Any, run_id: str) -> dict[str, float]:
            return _fit_run(module, cfg, data, uri, client, run_id, callbacks or [], checkpoint_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="ablate-source-") as tmp:
            source = load_source(cfg.prune.source, uri, Path(tmp), field="prune.source")
            check_same_tokenizer(source, tokenizer, field="prune.source")
        module_tags, inputs = {tracking.SOURCE: source.run_id or source.source}, {}

        def work(client: Any, run_id: str) -> dict[str, float]:
            return prune_train(cfg, source, data, uri, client, run_id)

    return tracked_run(cfg, uri, work, experiment=experiment, name=name, parent_run_id=parent_run_id,
                       tags={**module_tags, **(tags or {})}, inputs=inputs, tokenizer=tokenizer,
                       extra_params=extra_params)


def tracked_run(cfg: ExperimentConfig, uri: str, work: Callable[[Any, str], dict[str, float]], *,
                experiment: str | None, name: str | None, parent_run_id: str | None, tags: dict[str, str],
                inputs: dict[str, float], tokenizer: Path | None,
                extra_params: dict[str, str] | None = None) -> RunResult:
    """Run ``work(client, run_id)`` inside a new MLflow run that logs ``cfg``, ``inputs`` (metrics at
    step 0) and the tokenizer first, and always ends FINISHED, FAILED or KILLED (Ctrl-C re-raised
    as KeyboardInterrupt; an Optuna prune ends it FINISHED and is re-raised)."""
    client = tracking.connect(uri)
    exp_id = tracking.experiment_id(client, experiment or cfg.tracking.experiment, uri)
    run_id = tracking.start_run(client, exp_id, name or cfg.tracking.run_name or cfg.name,
                                {tracking.ROLE: "run", **tags}, parent_run_id)
    sigint = signal.getsignal(signal.SIGINT)
    try:
        tracking.log_run_inputs(client, run_id, cfg, inputs, tokenizer)
        for key, value in (extra_params or {}).items():  # e.g. a study's variant name
            client.log_param(run_id, key, value)
        metrics = work(client, run_id)
    except SystemExit as exc:  # Lightning turns Ctrl-C into sys.exit(1) after cleaning up
        tracking.end_run(client, run_id, "KILLED")
        raise KeyboardInterrupt from exc
    except KeyboardInterrupt:
        tracking.end_run(client, run_id, "KILLED")
        raise
    except TrialPruned:  # stopped early by the sweep's pruner: a finished, shorter run
        tracking.end_run(client, run_id, "FINISHED")
        raise
    except BaseException:
        tracking.end_run(client, run_id, "FAILED")
        raise
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores SIGINT after an interrupt
    tracking.end_run(client, run_id, "FINISHED")
    return RunResult(run_id=run_id, tracking_uri=uri, metrics=metrics)
