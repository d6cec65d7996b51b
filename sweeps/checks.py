"""A run's checks: what a config asks of this machine, of MLflow and of the file system, checked by
:func:`check_run` (``ablate train``, and ``ablate sweep`` for every trial a study can produce) before a
folder, store or run exists: device and node counts, launch strategies, a model too large for this
machine's memory, names past MLflow's limits, the folders the run writes."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ablate.datamodules.catalog import active_catalog, check_model
from ablate.datamodules.provenance import check_data, check_task_reachable
from ablate.datamodules.task_rows import check_task_data
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import MAX_SEED, ExperimentConfig
from ablate.lightning_modules.config.metric_names import (
    DOWNSTREAM_AVG,
    NAMESPACES,
    VAL_SENTENCE_ACC,
    VALIDATION,
    task_metrics,
)
from ablate.lightning_modules.config.paths import output_file, output_folder
from ablate.lightning_modules.config.run import TrainerConfig
from ablate.sweeps.base import StudyBase
from ablate.sweeps.guard import reference_task
from ablate.sweeps.spec import StudySpec, corner_trials, study_model_config
from ablate.sweeps.study_models import PLACEHOLDER_SOURCE

MLFLOW_NAME = 250
"""The longest MLflow run name (its ``runs.name`` column)."""
MLFLOW_EXPERIMENT = 500
"""The longest MLflow experiment name (``mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH``)."""
BYTES_PER_TRAINED_PARAM = 16
"""fp32 weight, gradient and AdamW's two moments."""
CLUSTER_VARIABLES = ("SLURM_NTASKS", "NODE_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_SIZE")
"""Set by the launchers under which Lightning runs one process per node (SLURM, torchrun, MPI)."""


@dataclass(frozen=True)
class Machine:
    """What this machine has, as the plan needs it."""

    cuda: int
    mps: bool
    cores: int
    memory: int  # bytes of host memory
    gpu_memory: int  # bytes of the first CUDA device, 0 without one
    cluster: bool

    @classmethod
    def here(cls) -> Machine:
        import torch  # here, not at import: a config error answers before torch is loaded

        cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        gpu = torch.cuda.get_device_properties(0).total_memory if cuda else 0
        cluster = any(os.environ.get(name) for name in CLUSTER_VARIABLES)
        return cls(cuda, torch.backends.mps.is_available(), cores, memory, gpu, cluster)


def check_machine(t: TrainerConfig, machine: Machine) -> None:
    """The trainer section asks only for what ``machine`` has, and for a launch ablate can run."""
    name = t.accelerator.lower()
    if name in ("gpu", "cuda") and not machine.cuda and not (name == "gpu" and machine.mps):
        raise ConfigError(f"trainer.accelerator: {t.accelerator!r}, but this machine has no GPU (use auto or cpu)")
    if name == "mps" and not machine.mps:
        raise ConfigError("trainer.accelerator: 'mps', but this machine has no Apple GPU (use auto or cpu)")
    if name == "tpu":
        raise ConfigError("trainer.accelerator: 'tpu' is not supported by ablate's runner (use auto, cpu or gpu)")
    on_gpu = machine.cuda > 0 and name in ("auto", "gpu", "cuda")
    have = machine.cuda if on_gpu else machine.cores
    kind = "CUDA devices" if on_gpu else "CPU cores"
    if t.devices > have:
        raise ConfigError(f"trainer.devices: {t.devices}, but this machine has {have} {kind}")
    if t.num_nodes > 1 and not machine.cluster:
        raise ConfigError(
            f"trainer.num_nodes: {t.num_nodes} machines, but this process was not started by a cluster launcher "
            f"(SLURM, torchrun: none of {', '.join(CLUSTER_VARIABLES)} is set); it would wait for the others forever"
        )
    if t.strategy == "ddp_spawn":
        raise ConfigError(
            "trainer.strategy: 'ddp_spawn' pickles the module and the runner's MLflow and Optuna callbacks into "
            "new processes, which they do not survive; use ddp (ablate forks its ranks, or spawns them once "
            "CUDA is initialised)"
        )
    if t.precision == "16-mixed" and not on_gpu:
        raise ConfigError("trainer.precision: '16-mixed' needs a CUDA GPU; on the CPU use bf16-mixed or 32-true")


def check_size(cfg: ExperimentConfig, machine: Machine) -> None:
    """A model this machine can hold while training it (weights, gradients, AdamW's moments)."""
    if cfg.regime not in ("pretrain", "distill"):  # the model is a trained source's: it exists
        return
    from ablate.lightning_modules.measure.accounting import report_for

    report = report_for(cfg.model, cfg.objective, cfg.data.max_length)
    params = report.backbone + report.heads
    need = params * BYTES_PER_TRAINED_PARAM
    on_gpu = machine.cuda > 0 and cfg.trainer.accelerator.lower() in ("auto", "gpu", "cuda")
    have, where = (machine.gpu_memory, "GPU") if on_gpu else (machine.memory, "host")
    if have and need > have:
        raise ConfigError(
            f"model: {params / 1e9:.1f}B parameters need {need / 2**30:.0f} GiB to train (weights, gradients, "
            f"AdamW), more than this machine's {have / 2**30:.0f} GiB of {where} memory"
        )


def check_names(cfg: ExperimentConfig) -> None:
    """Names MLflow stores within its limits."""
    t = cfg.tracking
    if t.run_name is not None and len(t.run_name) > MLFLOW_NAME:
        raise ConfigError(f"tracking.run_name: {len(t.run_name)} characters; MLflow keeps at most {MLFLOW_NAME}")
    if t.experiment is not None and len(t.experiment) > MLFLOW_EXPERIMENT:
        raise ConfigError(
            f"tracking.experiment: {len(t.experiment)} characters; MLflow keeps at most {MLFLOW_EXPERIMENT}"
        )
    if len(cfg.name) > MLFLOW_NAME:
        raise ConfigError(f"name: {len(cfg.name)} characters; MLflow keeps at most {MLFLOW_NAME} in a run name")


def check_sqlite(url: str | None, key: str) -> None:
    """An embedded SQLite store a command will create or write (``--storage``, ``--tracking-uri``)."""
    if url and url.startswith("sqlite:///"):
        output_file(url.removeprefix("sqlite:///"), key)


def check_folders(cfg: ExperimentConfig, checkpoints: str | None = None) -> None:
    """The folders a run writes can be made (nothing is made here)."""
    if cfg.tracking.tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI"):
        output_folder(cfg.tracking.root, "tracking.root")
    if cfg.data.cache_dir is not None:
        output_folder(cfg.data.cache_dir, "data.cache_dir")
    if checkpoints is not None and "://" not in checkpoints and checkpoints != "mlflow":
        output_folder(checkpoints, "--checkpoints")


def check_run(cfg: ExperimentConfig, checkpoints: str | None, machine: Machine | None) -> None:
    """Everything :mod:`ablate.sweeps.checks` checks about one run's config, before it is written;
    what it asks of ``machine`` too, unless None (a study checked for another machine)."""
    if machine is not None:
        check_machine(cfg.trainer, machine)
    check_names(cfg)
    check_folders(cfg, checkpoints)
    check_data(cfg)  # local files and the data catalog's copies exist; hub names are well formed (offline)
    if cfg.regime == "finetune" and cfg.finetune.kind != "span":  # columns and labels of the local copies
        check_task_data(cfg.finetune)
    if machine is not None:
        check_size(cfg, machine)
    from ablate.sweeps.engine.sources import check_sources_fit  # torch: imported when a run is checked

    check_sources_fit(cfg)  # a local source's shape fits its method (read from its config files alone)


def trial_metrics(cfg: ExperimentConfig, tasks: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The validation metrics a study trial of ``cfg`` returns, fine-tuned on ``tasks`` ((task, metric)),
    and its model's accounting (``model_bytes``, ``flops_per_token``, measured: ``latency_ms_b1``, ``_b32``)."""
    counted = ("model_bytes", "flops_per_token", *(("latency_ms_b1", "latency_ms_b32") if cfg.trainer.measure else ()))
    if cfg.regime == "finetune":
        return (*task_metrics(cfg.finetune.task, cfg.finetune.metric), *counted)
    sentence = (VAL_SENTENCE_ACC,) if cfg.objective.sentence != "none" else ()
    chained = tuple(name for task in tasks for name in task_metrics(*task))
    return (*VALIDATION, *sentence, *chained, *((DOWNSTREAM_AVG,) if tasks else ()), *counted)


def check_optimized_metric(
    metric: str, cfg: ExperimentConfig, tasks: Sequence[tuple[str, str]], key: str = "optimize.metric"
) -> None:
    """The metric the study optimizes (``optimize.metric``; or bounds: ``key``) is one its trials log: a
    validation metric of their regime, a task's, the model's accounting (``params.*`` too), or one of the
    other namespaces runs log (``quant/...``, ``intrinsic/...``)."""
    known = trial_metrics(cfg, tasks)
    if metric.startswith("params."):
        return
    namespace, slash, _ = metric.partition("/")
    own = (cfg.finetune.task, *(d.name for d in cfg.finetune.extra_validation)) if cfg.regime == "finetune" else ()
    task_names = {task for task, _ in tasks} | set(own)  # a task's further dev sets (mnli-mm) log as tasks
    if metric in known or (slash and namespace in task_names):
        return
    if slash and namespace not in NAMESPACES:
        have = ", ".join(sorted(task_names)) or "none"
        raise ConfigError(
            f"{key}: {metric!r} is not a metric ablate logs: {namespace!r} is neither one of its "
            f"namespaces ({', '.join(NAMESPACES)}) nor a task this study fine-tunes (tasks: {have})"
        )
    if namespace == "val" or metric == DOWNSTREAM_AVG or not slash:
        close = difflib.get_close_matches(metric, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; its trials log {', '.join(known)}"
        raise ConfigError(f"{key}: {metric!r} is not logged by this study's trials{hint}")


def check_study(spec: StudySpec, base: StudyBase, where: Path | str, machine: Machine | None) -> None:
    """Every trial the study can produce (each grid point or range corner, variant and seed, its
    study model) checked as :func:`check_run` checks one run; and the metric it optimizes against them.
    ``machine`` None leaves out what the trials ask of the machine (``sweep --check``)."""
    active_catalog()  # a broken ABLATE_DATA_CATALOG is the environment's error, said as such, not the study's
    for name in spec.variants:  # a trial's run name is "variant=NAME seed=N"
        if len(name) > MLFLOW_NAME - 50:
            raise ConfigError(
                f"{where}: variants.{name[:20]}...: a name of {len(name)} characters; a variant's trials are named "
                f"after it and MLflow keeps run names of at most {MLFLOW_NAME}"
            )
    for seed in spec.seeds:
        if not 0 <= seed <= MAX_SEED:
            raise ConfigError(f"{where}: seeds: {seed}: must be between 0 and {MAX_SEED} (numpy's range)")
    trials = corner_trials(spec, base)
    if spec.source is not None:  # the model a study that only fine-tunes starts each task from
        try:
            check_model(spec.source, "source")
        except (ConfigError, DataError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
    if spec.study_model is not None and spec.study_model.model is not None:
        try:
            check_run(study_model_config(base, spec), spec.checkpoints, machine)
        except (ConfigError, DataError) as exc:
            raise type(exc)(f"{where}: {spec.study_model.SECTION}.{exc}") from None
        _check_guard_reference(spec, base, where)
    for i, task in enumerate(spec.tasks):  # each task's data, as check_data checks a run's
        try:
            check_task_reachable(task, f"tasks[{i}]")
            if task.kind != "span":
                check_task_data(task, f"tasks[{i}]")  # columns and labels of the local copies
        except (ConfigError, DataError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
    for params, cfg in trials:
        mine = [t for t in spec.tasks if t.runs_for(params.get("variant"))]
        # a study with source: pre-trains nothing; its runs are the tasks' fine-tuning runs
        runs = [cfg] if spec.source is None else [t.config(cfg, spec.source) for t in mine]
        try:
            for run in runs:
                check_run(run, spec.checkpoints, machine)
        except (ConfigError, DataError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
        tasks = [(t.task, t.config(cfg, PLACEHOLDER_SOURCE, teacher=PLACEHOLDER_SOURCE).finetune.metric) for t in mine]
        tasks += [(d.name, t.metric) for t in mine for d in t.extra_validation]  # mnli-mm/... beside mnli/...
        try:
            check_optimized_metric(spec.optimize.metric, cfg, tasks)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if (guard := spec.optimize.guard) is not None:
            try:
                check_optimized_metric(guard.metric, cfg, tasks, key="optimize.guard.metric")
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        if spec.optimize.metric.startswith("glue/") and not any(t.glue for t in mine):
            raise ConfigError(
                f"{where}: optimize.metric: {spec.optimize.metric!r} is logged by a trial fine-tuned on GLUE tasks "
                f"(tasks: glue, or - glue: mrpc); {'this trial' if spec.variants else 'this study'} has none"
            )


def _check_guard_reference(spec: StudySpec, base: StudyBase, where: Path | str) -> None:
    """A guard whose reference is the study model's value: its model logs the guard's metric (a
    pre-trained model its validation and accounting; a task's metric, the model fine-tuned on a task
    that distils from it)."""
    guard, model = spec.optimize.guard, spec.study_model
    if guard is None or guard.reference is not None or model is None or reference_task(guard, spec.tasks) is not None:
        return
    logged = trial_metrics(study_model_config(base, spec), ())
    if guard.metric not in logged and not guard.metric.startswith("params."):
        raise ConfigError(
            f"{where}: optimize.guard.reference: the study's {model.SECTION} logs no {guard.metric} (it logs "
            f"{', '.join(logged)}; a task's metric: a task that distils from it, tasks[i].distill); give the "
            "reference's value (optimize.guard.reference: 0.91)"
        )
