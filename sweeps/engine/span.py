"""What a fine-tuning run (:mod:`~ablate.sweeps.engine.finetune`) does differently for a span task
(``finetune.kind: span``, SQuAD): its data module, its module (distilled from a span teacher when
``distill.teacher`` is set) and its latency; the rest is the fine-tuning run's (docs/guides/squad.md)."""

from __future__ import annotations

from pathlib import Path

import torch

from ablate.datamodules.squad import SquadDataModule, collate
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.interop.hub import same_vocabulary
from ablate.lightning_modules.measure.exit_speed import shape_latency_ms
from ablate.lightning_modules.measure.measuring import placed
from ablate.lightning_modules.methods.span import SpanModule, span_distill_module
from ablate.lightning_modules.model.span import SpanModel
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.inputs import task_workers
from ablate.sweeps.engine.sources import Source, load_span_source

TIMED = 200
"""Dev windows timed at batch 1 for ``<task>/latency_ms``."""


def span_module(cfg: ExperimentConfig, source: Source, uri: str, workdir: Path) -> tuple[SpanModule, dict[str, str]]:
    """The span task's module (distilled from ``distill.teacher``, a fine-tuned span model, when set) and its tags."""
    if cfg.distill.teacher is None:
        return SpanModule(cfg, source.model), {}
    teacher, tok = load_span_source(cfg.distill.teacher, uri, workdir / "teacher", field="distill.teacher")
    if tok is not None and source.tokenizer is not None and not same_vocabulary(tok, source.tokenizer):
        raise ConfigError(
            f"distill.teacher: {teacher.source} was fine-tuned with another tokenizer than finetune.source's"
        )
    module = span_distill_module(cfg, source.model, teacher.model, teacher.model_cfg)
    return module, {tracking.TEACHER: teacher.run_id or teacher.source}


def span_data(cfg: ExperimentConfig, tokenizer: Path) -> SquadDataModule:
    """The span task's data, read, checked and tokenized (before the run exists)."""
    f = cfg.finetune
    data = SquadDataModule(
        f,
        tokenizer,
        seed=cfg.seed,
        limit_train=f.train_examples,
        num_workers=task_workers(cfg),
        whole_batches=cfg.trainer.compile,
    )
    data.setup("fit")
    return data


def span_latency(model: SpanModel, cfg: ExperimentConfig, data: SquadDataModule) -> dict[str, float]:
    """``<task>/latency_ms``: the model's batch-1 latency on the CPU, the mean over the first
    :data:`TIMED` dev windows of each one's fastest of 3 runs."""
    val = data.val_set
    assert val is not None, "set up before the run"
    rows = [collate([val[i]]) for i in range(min(TIMED, len(val)))]
    with placed(model, torch.device("cpu"), train=False):
        return {f"{cfg.finetune.task}/latency_ms": shape_latency_ms(model, rows)}  # type: ignore[arg-type]
