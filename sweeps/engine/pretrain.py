"""Pre-training and distillation: one phase (the fit of the module, the distillation's stages inside
its schedule), then the probes, quantize and score, and the weights as the config says."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl

from ablate.datamodules.pretrain import PretrainDataModule, probe_streams
from ablate.lightning_modules.config.distill import DistillConfig, schedule
from ablate.lightning_modules.config.experiment import ExperimentConfig, Regime
from ablate.lightning_modules.measure.cache import cached_counts
from ablate.lightning_modules.measure.measuring import placed, training_device
from ablate.lightning_modules.methods.pretrain import PretrainModule, distill_module
from ablate.lightning_modules.methods.probe import intrinsic_eval
from ablate.lightning_modules.methods.quantization.apply import check_quantizable
from ablate.lightning_modules.methods.train_module import OptimSetup
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepared, RunContext
from ablate.sweeps.engine.inputs import corpus, student, tokenizer_of
from ablate.sweeps.engine.phases import Finisher, Leaving, Phase, RunPlan
from ablate.sweeps.engine.quant import quantize_and_log
from ablate.sweeps.engine.sources import load_source, student_vocabulary

PHASES: Mapping[Regime, str] = {"pretrain": "pre-training", "distill": "distillation"}
"""The name of the fit's phase, by its regime."""


@dataclass(frozen=True)
class PretrainRun:
    """Pre-training's materials: the module it fits and its corpus."""

    module: PretrainModule
    data: PretrainDataModule

    def leaving(self, handed: None) -> Leaving:
        return self.module.model, self.module.cfg, self.data.tokenizer_path


def _module(m: PretrainRun, handed: None, run: ActiveRun) -> tuple[pl.LightningModule, None]:
    return m.module, None


def _probes(m: PretrainRun, handed: None, run: ActiveRun, step: int, metrics: dict[str, float]) -> dict[str, float]:
    """The same probes for every model, whatever its own objective; eager, on the training device
    (Lightning hands the model back on the CPU after a fit)."""
    cfg = m.module.cfg
    run.phase("probes", "MLM, NSP and SOP probes on the frozen encoder")
    with placed(m.module.model, training_device(cfg.trainer.accelerator), train=False):
        n = cfg.trainer.probe_batches
        streams = probe_streams(cfg.data, cfg.model.vocab_size, cfg.seed, n, max(1, n // 4))
        scores = intrinsic_eval(m.module.model, streams, seed=cfg.seed).as_metrics()
    run.log(scores, step=step)
    return scores


def _quantized(m: PretrainRun, handed: None, run: ActiveRun, step: int, metrics: dict[str, float]) -> dict[str, float]:
    """The trained model, quantized: its metrics become the run's."""
    return quantize_and_log(m.module.model, m.module.cfg, m.data, run, step, metrics)


def stages_detail(d: DistillConfig, layers: int, steps: int, field: str = "trainer.max_steps") -> str:
    """A distillation's stages inside its one fit: ``strategy progressive: layer-1 0-40, ...``."""
    stages = schedule(d, layers, steps, steps_field=field)
    return f"strategy {d.strategy}: " + ", ".join(f"{s.name} {s.start}-{s.end}" for s in stages)


def pretrain_plan(cfg: ExperimentConfig) -> RunPlan[PretrainRun, None]:
    """One fit of ``trainer.max_steps`` (a distillation's stages are its schedule's), then the probes
    (``trainer.intrinsic``) and the quantized model scored (``quant.method``)."""
    regime = cfg.regime or "pretrain"
    how = "new module" + (" (int8 fake-quantized from the first step)" if cfg.quant.method == "qat-int8" else "")
    detail = stages_detail(cfg.distill, cfg.model.num_layers, cfg.trainer.max_steps) if regime == "distill" else ""
    optim = OptimSetup.pretraining(cfg, cfg.trainer.max_steps).describe()
    phase = Phase[PretrainRun, None](PHASES[regime], cfg.trainer.max_steps, _module, how, detail, optim=optim)
    finishers: list[Finisher[PretrainRun, None]] = []
    if cfg.trainer.intrinsic:
        finishers.append(Finisher("probes", "MLM, NSP and SOP probes on the frozen encoder", _probes))
    if cfg.quant.enabled:
        finishers.append(
            Finisher("quantize and score", f"{cfg.quant.method}, held-out MLM metrics on the CPU", _quantized)
        )
    return RunPlan([phase], finishers)


def vocabulary_metrics(module: PretrainModule) -> dict[str, float]:
    """A student with its own vocabulary: the share of its tokens that have a teacher counterpart
    (``distill/vocab_coverage``, logged at step 0 with the parameter counts)."""
    bridge = module.link.vocab if module.link is not None else None
    return {} if bridge is None else {"distill/vocab_coverage": bridge.coverage}


def _prepared(
    module: PretrainModule, data: PretrainDataModule, ctx: RunContext, tags: dict[str, str]
) -> Prepared[PretrainRun, None]:
    """A pre-training module fitted in the run: its counts and latency measured first."""
    cfg = module.cfg  # a distillation's: distill.mix_prob and dual_weight resolved against its teacher
    check_quantizable(module.model, cfg.quant, "the model")
    inputs, measured_on = ctx.measure(cached_counts, module.model, cfg.model, cfg)
    if cfg.trainer.compile:  # graphs kept under the tracking root (fine-tuning's too)
        tracking.compile_cache(cfg.tracking.root)
    return Prepared(
        cfg=cfg,
        materials=PretrainRun(module, data),
        handed=None,
        data=data,
        tokenizer=tokenizer_of(data),
        tags=tags,
        inputs={**inputs, **vocabulary_metrics(module)},
        params=measured_on,
    )


def prepare_pretrain(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared[PretrainRun, None]:
    """Pre-training (MLM, and SOP/NSP when set) from random weights or ``init_from``."""
    data = corpus(cfg)
    return _prepared(PretrainModule(cfg, student(cfg, tokenizer_of(data))), data, ctx, {})


def prepare_distill(cfg: ExperimentConfig, ctx: RunContext, uri: str, stack: ExitStack) -> Prepared[PretrainRun, None]:
    """Pre-training distillation from ``distill.teacher``, tagged with the teacher's run."""
    data = corpus(cfg)
    tokenizer = tokenizer_of(data)
    model = student(cfg, tokenizer)
    with tempfile.TemporaryDirectory(prefix="ablate-teacher-") as tmp:
        teacher = load_source(cfg.distill.teacher, uri, Path(tmp))  # type: ignore[arg-type]  # set in distill
        vocab = student_vocabulary(teacher, tokenizer, cfg.model)  # None: the teacher's own (checked)
    module = distill_module(cfg, teacher.model, teacher.model_cfg, model, vocab)
    return _prepared(module, data, ctx, {tracking.TEACHER: teacher.run_id or teacher.source})
