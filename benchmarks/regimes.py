"""The runs ``ablate bench loop --regime`` times against their isolated steps: ``pretrain``, ``distill``
(the ``distill-mini`` case), ``prune`` (schuBERT's gate phase) and ``finetune`` (``--task``:
:mod:`ablate.benchmarks.finetune_tasks`); their sources written at initialisation beside the run, the
step alone the module the run builds, trained by :func:`module_step` (docs/performance.md)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

import torch

from ablate.benchmarks.cases import Case
from ablate.benchmarks.finetune_tasks import DEFAULT_TASK, SQUAD, glue_config, squad_config
from ablate.benchmarks.train_speed import Batch, ablate_side, batches
from ablate.datamodules.transfer import unpack
from ablate.lightning_modules.config.distill import DistillConfig
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import DataConfig, ExperimentConfig, ObjectiveConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.prune import PruneConfig
from ablate.lightning_modules.methods.train_module import TrainModule
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.sweeps.engine.context import RunContext

REGIMES = ("pretrain", "distill", "prune", "finetune")
DEFAULT_CASE = {
    "cpu": {"pretrain": "albert-tiny", "distill": "distill-mini", "prune": "bert-tiny", "finetune": "bert-tiny"},
    "cuda": {
        "pretrain": "bert-small",
        "distill": "distill-mobilebert",
        "prune": "bert-small",
        "finetune": "bert-small",
    },
}
FINETUNE_BATCH = 32  # sentences per fine-tuning step by default (SST-2's usual batch; --batch)
Step = Callable[[Batch], torch.Tensor]


@dataclass(frozen=True)
class TaskChoice:
    """What ``--regime finetune`` fine-tunes: ``--task``, its SST-2 folder (``--sst2``; None: the
    catalog or synthetic sentences) and ``--batch`` (examples, or SQuAD windows, per step)."""

    task: str = DEFAULT_TASK
    sst2: Path | None = None
    batch: int = FINETUNE_BATCH


@dataclass
class Setup:
    """One regime's measurement: the run's config, what the heading says, the run, the step alone.

    Attributes:
        cfg: the run's config (the trainer section is the timed fit's).
        what: the regime in words, for the heading.
        loader: how the run's loader feeds it, for the heading.
        run: runs ``ablate train`` (:func:`ablate.sweeps.engine.runner.train`) of ``cfg``.
        step: builds the step alone (a fresh module, its optimizer) and its batches on the device.
        after: a measurement of the regime's own, after the run (its table lines), or None.
    """

    cfg: ExperimentConfig
    what: str
    loader: str
    run: Callable[[RunContext], object]
    step: Callable[[int], tuple[Step, list[Batch]]]
    after: Callable[[], list[str]] | None = None


def module_step(module: TrainModule, device: torch.device, grad_clip: float) -> Step:
    """The step alone of ``module``: what Lightning's loop does per batch, without the loop (its
    hooks, callbacks, logging, loader): the stage hook, ``training_step``, backward, gradient
    clipping as ``optim.grad_clip`` asks, the optimizer and schedule, the module's batch-end hook
    (pruning's gate clamp). Nothing is logged (the loop logs every ``trainer.log_every`` steps)."""
    module.to(device).train()
    module.logs_this_step = lambda: False  # type: ignore[method-assign]
    optimizer, schedule = module.optimizer_and_schedule()  # pruning's gates: a constant rate, no schedule
    trained = [p for group in optimizer.param_groups for p in group["params"]]

    def step(batch: Batch) -> torch.Tensor:
        module.on_train_batch_start(batch, 0)
        loss = module.training_step(batch, 0)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        if grad_clip:
            torch.nn.utils.clip_grad_norm_([p for p in trained if p.grad is not None], grad_clip, foreach=True)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        optimizer.zero_grad(set_to_none=True)
        module.on_train_batch_end(loss, batch, 0)
        return loss.detach()

    return step


def padded(batch: Batch, length: int, pad_id: int) -> Batch:
    """``batch`` padded on the right to ``length`` tokens, as a loader padding to ``max_length`` makes it."""
    extra = length - batch["input_ids"].shape[1]
    fill = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": False}
    return {k: torch.nn.functional.pad(v, (0, extra), value=fill[k]) if k in fill else v for k, v in batch.items()}


def padding_comparison(step: Step, data: list[Batch], length: int, pad_id: int, warmup: int = 3) -> list[str]:
    """The fine-tuning step on the same batches padded to their longest row and to ``length``
    (``finetune.max_length``), one of each in turn: median ms/step, real tokens/s, the speed-up."""
    import statistics
    import time

    times: dict[str, list[float]] = {"longest": [], "max_length": []}
    for i, batch in enumerate(data):
        pair = {"longest": batch, "max_length": padded(batch, length, pad_id)}
        for name in pair if i % 2 == 0 else reversed(pair):
            start = time.perf_counter()
            float(step(pair[name]))
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    tokens = statistics.mean(float(b["attention_mask"].sum()) for b in data[warmup:])
    width = statistics.mean(b["input_ids"].shape[1] for b in data[warmup:])
    median = {k: statistics.median(v) for k, v in times.items()}
    return [
        "",
        f"| padding ({len(times['longest'])} batches, each both ways in turn) | T (mean) | ms/step (median) | "
        "tokens/s |",
        "|---|---:|---:|---:|",
        f"| to the longest row (the loader's) | {width:.1f} | {1e3 * median['longest']:.1f} | "
        f"{tokens / median['longest']:,.0f} |",
        f"| to finetune.max_length | {length} | {1e3 * median['max_length']:.1f} | "
        f"{tokens / median['max_length']:,.0f} |",
        "",
        f"- padding to the longest row: **{median['max_length'] / median['longest']:.2f}x** the step padded to "
        f"max_length {length}",
    ]


def _save(model_cfg: object, objective: ObjectiveConfig, data: DataConfig, folder: Path, seed: int) -> str:
    """A model of ``model_cfg`` at its initialisation, exported to ``folder`` with ``data``'s tokenizer."""
    from ablate.datamodules.tokenizer import load_or_train_tokenizer
    from ablate.lightning_modules.interop.export import export

    cfg = ExperimentConfig(model=model_cfg, objective=objective, data=data, seed=seed)  # type: ignore[arg-type]
    _, tokenizer = load_or_train_tokenizer(data, cfg.model.vocab_size)
    torch.manual_seed(seed)
    export(build_pretraining_model(cfg.model, objective), cfg, folder, format="ablate", tokenizer=tokenizer)
    return str(folder)


WORDS = {
    1: "good great moving funny brilliant charming warm clever delightful fresh".split(),
    0: "bad dull boring flat tedious clumsy stale weak lifeless awkward".split(),
    None: "the film a story its cast and of with but it is this movie director plot an as in that".split(),
}


def synthetic_sst2(folder: Path, train: int = 4000, validation: int = 400, seed: int = 0) -> Path:
    """``train.tsv`` and ``validation.tsv`` in SST-2's format (``sentence``, ``label``) and about its
    lengths (training phrases of 1 to 50 words, most short), labelled by their sentiment words."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.tsv", train), ("validation.tsv", validation)):
        lines = ["sentence\tlabel"]
        for _ in range(rows):
            label = rng.randint(0, 1)
            n = min(50, max(1, int(rng.lognormvariate(2.0, 0.8))))
            words = [rng.choice(WORDS[label] if rng.random() < 0.2 else WORDS[None]) for _ in range(n)]
            lines.append(f"{' '.join(words)}\t{label}")
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _train(cfg: ExperimentConfig) -> Callable[[RunContext], object]:
    def run(ctx: RunContext) -> object:
        from ablate.sweeps.engine.runner import train

        return train(cfg, ctx)

    return run


def check_case(regime: str, case: Case) -> None:
    """ConfigError (``--case``) when ``case`` cannot run ``regime``: a distillation needs a teacher,
    a pruning a model schuBERT's gates fit."""
    from ablate.lightning_modules.methods.pruning.gates import check_supported

    if regime == "distill" and case.teacher is None:
        raise ConfigError(f"--case: {case.name} has no teacher for --regime distill (distill-mini has one)")
    if regime == "prune":
        try:
            check_supported(case.model)
        except ConfigError as exc:
            raise ConfigError(f"--case: {case.name} cannot be pruned ({exc}); bert-tiny can") from None


def _distill(case: Case, cfg: ExperimentConfig, corpus: str, device: torch.device, root: Path) -> Setup:
    """A distillation from ``case.teacher`` (written at its initialisation) to ``case.model``."""
    assert case.teacher is not None  # check_case
    teacher = _save(case.teacher, cfg.objective, cfg.data, root / "teacher", cfg.seed + 1)
    run_cfg = replace(cfg, regime="distill", distill=DistillConfig(teacher=teacher))

    def step(n: int) -> tuple[Step, list[Batch]]:
        from ablate.lightning_modules.methods.pretrain import distill_module
        from ablate.sweeps.engine.sources import load_source

        s = load_source(teacher, "", root)  # the run's teacher, of the run's vocabulary
        module = distill_module(run_cfg, s.model, s.model_cfg)  # the student: a fresh initialisation
        return module_step(module, device, cfg.optim.grad_clip), batches(case, corpus, n, device)

    t = case.teacher
    what = (
        f"distillation: the teacher's forward (H={t.hidden_dim}, intra {t.intra_dim}, FFN {t.ffn_dim}, "
        f"L={t.num_layers}) and the student's step, MLM + {case.sentence.upper()} + KD + FMT + AT"
    )
    return Setup(run_cfg, what, f"data.num_workers {cfg.data.workers()}", _train(run_cfg), step)


def _prune(case: Case, cfg: ExperimentConfig, corpus: str, device: torch.device, root: Path) -> Setup:
    """schuBERT's gate phase on ``case.model`` (written at its initialisation): one round, no fine-tuning."""
    from ablate.lightning_modules.methods.pruning.gates import check_supported

    try:
        check_supported(case.model)
    except ConfigError as exc:
        raise ConfigError(f"--case: {case.name} cannot be pruned ({exc}); bert-tiny can") from None
    source = _save(case.model, cfg.objective, cfg.data, root / "source", cfg.seed)
    steps = cfg.trainer.max_steps
    prune = PruneConfig(source=source, method="schubert-all", target=0.75, rounds=1, gate_steps=steps, finetune_steps=0)
    run_cfg = replace(cfg, regime="prune", prune=prune)

    def step(n: int) -> tuple[Step, list[Batch]]:
        from ablate.lightning_modules.methods.prune import PruneModule
        from ablate.lightning_modules.methods.pruning.keep import VARIANTS
        from ablate.sweeps.engine.sources import load_source

        s = load_source(source, "", root, field="prune.source")
        module = PruneModule(replace(run_cfg, model=s.model_cfg), s.model, VARIANTS[prune.method])
        return module_step(module, device, cfg.optim.grad_clip), batches(case, corpus, n, device)

    what = "pruning: schuBERT's gate phase (schubert-all: gates on h, heads, Q/K, V, FFN), MLM + sentence + sparsity"
    return Setup(run_cfg, what, f"data.num_workers {cfg.data.workers()}", _train(run_cfg), step)


def _sst2_config(source: str, case: Case, steps: int, root: Path, choice: TaskChoice) -> tuple[FinetuneConfig, str]:
    """SST-2's ``finetune`` section (``choice.sst2``: a folder with its TSVs; None: synthetic sentences)
    and its origin."""
    sst2 = choice.sst2
    data = sst2 if sst2 is not None else synthetic_sst2(root / "sst2-synthetic")
    task = FinetuneConfig(
        source=source,
        task="sst2",
        train=str(data / "train.tsv"),
        validation=str(data / "validation.tsv"),
        max_length=case.seq_len,
        batch_size=choice.batch,
        max_steps=steps,
        val_every=steps,
    )
    return task, f"SST-2 ({'synthetic sentences' if sst2 is None else data})"


def _task_config(source: str, case: Case, steps: int, root: Path, choice: TaskChoice) -> tuple[FinetuneConfig, str]:
    """The ``finetune`` section of ``--task`` and where its data comes from
    (:mod:`ablate.benchmarks.finetune_tasks`)."""
    name = choice.task
    if name == DEFAULT_TASK:
        return _sst2_config(source, case, steps, root, choice)
    if name in SQUAD:
        return squad_config(name, source, case.seq_len, choice.batch, steps, root / "squad")
    return glue_config(name, source, case.seq_len, choice.batch, steps)


def _finetune(case: Case, cfg: ExperimentConfig, device: torch.device, root: Path, choice: TaskChoice) -> Setup:
    """Fine-tuning ``case.model`` (written at its initialisation) on ``--task``, compiled (bucketed
    widths, CUDA graphs on a GPU) when ``cfg`` compiles, as a study's fine-tuning stage runs; then, for
    a classification or regression task, the step padded both ways (a span task's windows fill ``T``)."""
    source = _save(case.model, cfg.objective, cfg.data, root / "source", cfg.seed)
    steps = cfg.trainer.max_steps
    task, origin = _task_config(source, case, steps, root, choice)
    # trainer.measure off: a fine-tuning run times its classifier after training, minutes on a busy CPU
    run_cfg = replace(cfg, regime="finetune", finetune=task, trainer=replace(cfg.trainer, measure=False))

    def step(n: int) -> tuple[Step, list[Batch]]:
        from ablate.datamodules.classification import ClassificationDataModule
        from ablate.datamodules.squad import SquadDataModule
        from ablate.lightning_modules.methods.finetune import FinetuneModule
        from ablate.sweeps.engine.sources import load_source
        from ablate.sweeps.engine.span import span_data, span_module

        s = load_source(source, "", root, field="finetune.source")
        at = replace(run_cfg, model=s.model_cfg)  # as the run builds them (sweeps/engine/finetune.py)
        assert s.tokenizer is not None
        module: FinetuneModule
        dm: ClassificationDataModule | SquadDataModule
        if task.kind == "span":
            module, dm = span_module(at, s, "", root)[0], span_data(at, s.tokenizer)
        else:
            module = FinetuneModule(at, s.model)
            dm = ClassificationDataModule(
                task,
                s.tokenizer,
                seed=run_cfg.seed,
                limit_train=task.train_examples,
                cache_dir=cfg.data.cache_dir,
                bucketed=cfg.trainer.compile,
            )
            dm.setup("fit")
        data = [{k: v.to(device) for k, v in unpack(b).items()} for b in islice(iter(dm.train_dataloader()), n)]
        return module_step(module, device, cfg.optim.grad_clip), data

    def compare() -> list[str]:
        from tokenizers import Tokenizer

        from ablate.datamodules.tokenizer import special_ids
        from ablate.lightning_modules.interop.hub import folder_tokenizer

        pad = special_ids(Tokenizer.from_file(str(folder_tokenizer(source)))).pad
        return padding_comparison(*step(min(steps, 20)), case.seq_len, pad)

    rows = "windows (T/3 apart)" if task.kind == "span" else "pairs" if len(task.text_fields) == 2 else "sentences"
    widths = "bucketed widths" if cfg.trainer.compile and task.kind != "span" else "padded to the longest"
    what = f"fine-tuning: {origin}, {task.kind}, B={choice.batch} {rows} {widths}, T <= {case.seq_len}"
    after = None if task.kind == "span" else compare
    return Setup(run_cfg, what, "loader in the main process", _train(run_cfg), step, after)


def isolated_step(
    case: Case, cfg: ExperimentConfig, corpus: str, device: torch.device, count: int
) -> tuple[Step, list[Batch]]:
    """The step alone at ``cfg``'s model, precision, compilation and clipping, and ``count``
    batches from the same pipeline already on ``device``."""
    init = build_pretraining_model(cfg.model, cfg.objective).state_dict()
    precision = "bf16" if cfg.trainer.precision.startswith("bf16") else "fp32"
    side = ablate_side(
        case,
        init,
        precision,
        cfg.trainer.compile,
        device,
        10 * cfg.trainer.max_steps,
        cfg.trainer.compile_mode,
        grad_clip=cfg.optim.grad_clip,
    )
    return side.step, batches(case, corpus, count, device)


def setup(
    regime: str,
    case: Case,
    cfg: ExperimentConfig,
    corpus: str,
    device: torch.device,
    root: Path,
    choice: TaskChoice = TaskChoice(),  # noqa: B008 - frozen
) -> Setup:
    """The measurement of ``regime`` on ``case``; ``cfg`` is the pre-training run of the case
    (:func:`ablate.benchmarks.loop.run_config`), whose data, trainer and tracking every regime keeps.
    ConfigError (``--case``) when the case cannot run the regime."""
    check_case(regime, case)
    if regime == "pretrain":
        loader = f"data.num_workers {cfg.data.workers()}"
        return Setup(cfg, "pre-training", loader, _train(cfg), lambda n: isolated_step(case, cfg, corpus, device, n))
    if regime == "finetune":  # compiled as cfg says: a study's fine-tuning stages compile with its trainer
        return _finetune(case, cfg, device, root, choice)
    # distillation and pruning are timed eagerly
    cfg = replace(cfg, trainer=replace(cfg.trainer, compile=False, compile_mode="default"))
    if regime == "distill":
        return _distill(case, cfg, corpus, device, root)
    if regime == "prune":
        return _prune(case, cfg, corpus, device, root)
    raise ValueError(f"unknown regime {regime!r}; expected one of {', '.join(REGIMES)}")
