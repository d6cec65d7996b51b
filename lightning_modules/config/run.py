"""The sections of the config that say how a run is driven: ``optim``, ``trainer`` and ``tracking``
(the model, data and methods' sections are in :mod:`ablate.lightning_modules.config.experiment` and the
``*_config`` modules, which this one does not import)."""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT
from ablate.lightning_modules.config.fields import NonNegFloat, NonNegInt, PosFloat, PosInt

CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"]  # trainer.compile_mode


@dataclass(frozen=True, config=STRICT)
class OptimConfig:
    """AdamW with linear warmup and linear decay to zero at ``trainer.max_steps``."""

    lr: PosFloat = 1e-3
    weight_decay: NonNegFloat = 0.01
    warmup_steps: NonNegInt = 100
    eps: PosFloat = 1e-6
    grad_clip: NonNegFloat = 1.0


@dataclass(frozen=True, config=STRICT)
class TrainerConfig:
    """Lightning Trainer settings.

    Attributes:
        max_steps: optimizer steps.
        val_every: run validation every this many steps (and at the end).
        val_batches: batches per validation.
        precision: Lightning precision, ``32-true`` or ``bf16-mixed``.
        accelerator: ``auto``, ``cpu``, ``gpu``.
        devices: devices for one run (DDP when > 1).
        strategy: how a run uses several devices: ``ddp`` (the ranks are forked at ``fit``;
            spawned once CUDA is initialised), ``ddp_spawn`` or ``ddp_fork``; ``auto`` = ``ddp``
            when ``devices`` > 1.
        compile: compile the encoder's layer block with ``torch.compile`` (one graph per layer shape, reused by
            every layer and every later model of that shape; embeddings, heads and losses eager); a
            fine-tuning run's training batches then come in a few widths and all of ``finetune.batch_size``
            rows (an epoch's smaller last batch left out).
        compile_mode: ``torch.compile``'s mode: ``default``, ``reduce-overhead`` (CUDA graphs:
            the step replays as one launch; for small models on a GPU) or
            ``max-autotune-no-cudagraphs`` (searches matmul kernels; long compile).
        log_every: log training metrics every this many steps (they reach the MLflow store
            together, every 5 s, at each checkpoint and when a fit ends).
        progress: show a progress bar.
        measure: measure forward latency (batch 1 and 32) and training activation memory
            before training and log them with the run (costly on CPU for large models).
        intrinsic: after training, score MLM accuracy and NSP and SOP accuracy by linear
            probes on the frozen [CLS] vector, whatever the run's own objective (logged as
            ``intrinsic/mlm_acc``, ``intrinsic/nsp_acc``, ``intrinsic/sop_acc``).
        probe_batches: the intrinsic probes' training batches per sentence task (``data.batch_size``
            rows each; the probes are tested on a quarter as many validation batches, at least one).
        accumulate_grad_batches: batches whose gradients are summed into one optimizer step
            (Lightning's): a step sees ``data.batch_size`` x this many sequences per device.
            ``max_steps``, ``val_every``, ``log_every``, ``optim.warmup_steps`` and the LR
            schedule all count optimizer steps, so a run reads this many times more batches.
        num_nodes: machines of a multi-node run (Lightning's ``num_nodes``): each node runs the
            same command under a cluster environment (SLURM, or ``MASTER_ADDR``/``NODE_RANK``)
            and starts an MLflow run of its own; node 0's has the metrics.
        deterministic: Lightning's ``deterministic=True``: ``torch.use_deterministic_algorithms``
            (an op without a deterministic implementation fails the run; cuDNN benchmarking
            off); slower. The data stream is seeded whatever this says.
        matmul_precision: fp32 matmuls (``torch.set_float32_matmul_precision``) for the whole run,
            training and the latency measured before it: ``high`` lets a CUDA GPU use TF32 tensor
            cores, ``highest`` keeps full fp32, ``medium`` allows bf16 passes; ``auto``: ``high`` on
            CUDA, ``highest`` elsewhere. Set when the run starts, restored when it ends; the
            precision used is logged as the param ``measure.matmul_precision``.
        profiler: Lightning's ``simple``, ``advanced`` (cProfile) or ``pytorch`` (torch.profiler,
            with Chrome traces) profiler, or None; its report is logged with the run under the
            artifacts ``profiler/``. With a profiler each callback is timed apart; without one the
            run's stateless callbacks reach Lightning as one (:mod:`ablate.sweeps.engine.grouped`).
    """

    max_steps: PosInt = 1000
    val_every: PosInt = 200
    val_batches: PosInt = 20
    precision: Literal["32-true", "bf16-mixed", "16-mixed"] = "32-true"
    accelerator: str = "auto"
    devices: PosInt = 1
    strategy: Literal["auto", "ddp", "ddp_fork", "ddp_spawn"] = "auto"
    compile: bool = False
    compile_mode: CompileMode = "default"
    log_every: PosInt = 10
    progress: bool = True
    measure: bool = True
    intrinsic: bool = False
    probe_batches: PosInt = 40
    accumulate_grad_batches: PosInt = 1
    num_nodes: PosInt = 1
    deterministic: bool = False
    matmul_precision: Literal["auto", "highest", "high", "medium"] = "auto"
    profiler: Literal["simple", "advanced", "pytorch"] | None = None


DEFAULT_ROOT = "ablate-runs"  # where the embedded stores go, relative to the working directory


@dataclass(frozen=True, config=STRICT)
class TrackingConfig:
    """Where runs are recorded.

    Attributes:
        tracking_uri: MLflow tracking URI; None = ``MLFLOW_TRACKING_URI`` or the
            embedded SQLite store under ``root``.
        experiment: MLflow experiment name; None = ``MLFLOW_EXPERIMENT_NAME`` or ``ablate``
            (:func:`ablate.sweeps.engine.tracking.experiment_name`). A study's runs go to the study's name.
        run_name: MLflow run name; None = derived from what the run changes.
        root: folder (relative to the working directory) of the embedded stores.
    """

    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    root: str = DEFAULT_ROOT
