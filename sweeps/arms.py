"""Every arm of a study, built on the meta device (:func:`check_arms`): the models its runs would make at
the study's own shapes, with what each method asks of its model checked (:data:`ARMS`, by regime), in
well under a second and without memory; before every sweep, and by ``ablate sweep smoke`` instead of
running a study this machine cannot run (docs/studies.md, "Checking a study, and its smoke run")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig, Regime, flatten
from ablate.lightning_modules.config.quant import check_group_size
from ablate.lightning_modules.methods.finetune import FinetuneModule, task_distill_module
from ablate.lightning_modules.methods.pretrain import distill_module
from ablate.lightning_modules.methods.pruning.gates import check_supported
from ablate.lightning_modules.methods.quantization.apply import check_quantizable
from ablate.lightning_modules.methods.span import SpanModule, span_distill_module
from ablate.lightning_modules.model.classifier import build_classifier
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model
from ablate.lightning_modules.model.span import build_span_model
from ablate.lightning_modules.model.vocab_bridge import own_vocabulary
from ablate.sweeps.base import StudyBase
from ablate.sweeps.engine.runner import run_name
from ablate.sweeps.spec import StudySpec, corner_trials, study_model_config
from ablate.sweeps.study_models import PLACEHOLDER_SOURCE, FinetuneTask


@dataclass(frozen=True)
class Source:
    """The study's model as a trial sees it: its config and its model (None: given, not built here)."""

    cfg: ExperimentConfig | None
    model: PretrainingModel | None


def _pretrain(cfg: ExperimentConfig, source: Source) -> PretrainingModel | None:
    model = build_pretraining_model(cfg.model, cfg.objective)
    check_quantizable(model, cfg.quant, "the model")
    return model


def _distill(cfg: ExperimentConfig, source: Source) -> PretrainingModel | None:
    student = build_pretraining_model(cfg.model, cfg.objective)
    if source.cfg is not None and source.model is not None and not own_vocabulary(cfg.model, source.cfg.model):
        student = distill_module(cfg, source.model, source.cfg.model, student).model
    check_quantizable(student, cfg.quant, "the student")
    return student


def _prune(cfg: ExperimentConfig, source: Source) -> PretrainingModel | None:
    if source.cfg is not None:
        if cfg.prune.method != "fewer-layers":
            try:
                check_supported(source.cfg.model)
            except ConfigError as exc:
                raise ConfigError(f"prune.source: {exc}") from None
        if source.model is not None:
            check_quantizable(source.model, cfg.quant, "the pruned model")
    return None  # its shape is found by the pruning


def _quant(cfg: ExperimentConfig, source: Source) -> PretrainingModel | None:
    if source.cfg is not None:
        try:
            check_group_size(cfg.quant, source.cfg.model)
        except ValueError as exc:
            raise ConfigError(f"{exc} (the model of quant.source)") from None
    if source.model is not None:
        check_quantizable(source.model, cfg.quant, "the source")
    return source.model


def _finetune(cfg: ExperimentConfig, source: Source) -> PretrainingModel | None:
    return None  # a fine-tuning study's source is given: checked when it is loaded


ARMS: Mapping[Regime, Callable[[ExperimentConfig, Source], PretrainingModel | None]] = {
    "pretrain": _pretrain,
    "distill": _distill,
    "prune": _prune,
    "quant": _quant,
    "finetune": _finetune,
}
"""What is built and checked for a trial of each regime; the model its tasks fine-tune (None: not known here)."""


def _task(task: FinetuneTask, cfg: ExperimentConfig, pretrained: PretrainingModel, source: Source) -> None:
    """The task's fine-tuning module on ``pretrained`` (its classifier or span head, exits, teacher link)."""
    ft = task.config(cfg, PLACEHOLDER_SOURCE, teacher=PLACEHOLDER_SOURCE)
    span = ft.finetune.kind == "span"  # SQuAD: a start/end head and its own module
    if task.study_teacher and source.cfg is not None and source.model is not None:
        std = source.cfg.model.init_std
        if span:
            span_distill_module(ft, pretrained, build_span_model(source.model, std), source.cfg.model)
        else:
            teacher = build_classifier(source.model, ft.finetune.num_labels, source.cfg.model.dropout, std)
            task_distill_module(ft, pretrained, teacher, source.cfg.model)
    else:
        (SpanModule if span else FinetuneModule)(ft, pretrained)


NOT_BUILT = ("optim.", "seed", "name", "tracking.")
"""Fields no module or model of an arm is built from: arms differing only in them are built once."""


def _arm_fields(cfg: ExperimentConfig) -> dict[str, object]:
    return {k: v for k, v in flatten(cfg).items() if not k.startswith(NOT_BUILT)}


def check_arms(spec: StudySpec, base: StudyBase, where: str) -> int:
    """Build every arm of the study on the meta device; the number of trials checked. Per trial (every
    grid point or range corner and variant), by its regime: pre-training, the model; distillation, the
    student joined to the study's teacher (layer and head maps, projections, the layers it starts from)
    unless it has a vocabulary of its own; pruning, a source the method can prune; quantization, a group
    size that fits the source and layers the method quantizes (a quantized trial of another regime: layers
    to quantize); each fine-tuning task, the classifier with its exits, joined to its fine-tuned teacher.
    The study's model is built once; one given as a ``source`` is checked when it is loaded.

    Raises:
        ConfigError: naming the study file, the trial and the field, for an arm that cannot run.
    """
    model = spec.study_model
    with torch.device("meta"):
        source = Source(None, None)
        if model is not None and model.model is not None:
            cfg = study_model_config(base, spec)
            source = Source(cfg, build_pretraining_model(cfg.model, cfg.objective))
        trials = corner_trials(spec, base)
        built: set[str] = set()
        for params, cfg in trials:
            assert cfg.regime is not None  # resolved by the config's validation
            shape = repr((params.get("variant"), _arm_fields(cfg)))
            if shape in built:  # an arm that differs from one checked only in what no module reads
                continue
            built.add(shape)
            try:
                pretrained = ARMS[cfg.regime](cfg, source)
                if pretrained is None:
                    continue
                if cfg.regime == "quant" and source.cfg is not None:  # what it fine-tunes is the source, as it is
                    cfg = dataclasses.replace(cfg, model=source.cfg.model)
                for task in spec.tasks:
                    if task.runs_for(params.get("variant")):
                        _task(task, cfg, pretrained, source)
            except ConfigError as exc:
                raise ConfigError(f"{where}: trial {run_name(params)}: {exc}") from None
    return len(trials)
