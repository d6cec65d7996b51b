"""A quantized run's model scored again, from its stored integers and scales (:func:`rescore_quantized`): on the
CPU in float32, as the run scored it (a fine-tuning run's dev set, else the held-out MLM batches), giving the
logged values again; what a report or an export checks a quantized model against."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from torch import nn

from ablate.datamodules.classification import ClassificationDataModule
from ablate.lightning_modules.config.distill import DistillConfig
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.methods.finetune import FinetuneModule
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.span import SpanModule
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.span import SpanModel
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.inputs import corpus
from ablate.sweeps.engine.quant import MLM, on_cpu, validate
from ablate.sweeps.engine.weights import RUNS, load_quantized, run_tokenizer, store


def scoring_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` for scoring a fine-tuned model on its dev set as the run scores it: on the CPU
    (:func:`~ablate.sweeps.engine.quant.on_cpu`), without the teacher it learnt from."""
    return replace(on_cpu(cfg), distill=DistillConfig())


def scoring_module(cfg: ExperimentConfig, model: nn.Module) -> FinetuneModule:
    """The module that scores ``model`` (a classifier or span model, quantized or not) on the dev sets
    as a fine-tuning run of ``cfg`` scores its own: the same task, metrics and dev sets."""
    eval_cfg = scoring_config(cfg)
    if isinstance(model, SpanModel):
        return SpanModule(eval_cfg, model)
    assert isinstance(model, Classifier), f"not a classifier: {type(model).__name__}"
    return FinetuneModule(eval_cfg, model)


def rescore_quantized(uri: str, run_id: str) -> dict[str, float]:
    """Run ``run_id``'s quantized model, rebuilt from its ``model/`` artifacts, scored again as the run
    scored it (see the module's docstring); the metrics by the names the run logged them under.

    Raises:
        ConfigError: the run logged no quantized model, or is a span task's (scored by its own path).
        DataError: the task's or corpus's data cannot be read.
    """
    stored = load_quantized(uri, run_id)
    cfg = stored.cfg
    if cfg.regime != "finetune":
        eval_cfg = on_cpu(cfg)
        model = stored.model
        assert isinstance(model, PretrainingModel)
        scores = validate(PretrainModule(eval_cfg, model), eval_cfg, corpus(cfg))
        return {k: scores[k] for k in MLM if k in scores}
    f = cfg.finetune
    if f.kind == "span":
        raise ConfigError(f"{RUNS}{run_id} is a span task's model (finetune.kind span): not re-scored here")
    with tracking.quiet_downloads(), tempfile.TemporaryDirectory(prefix="ablate-rescore-") as tmp:
        tok = run_tokenizer(store(uri), run_id, Path(tmp))
        if tok is None:
            raise ConfigError(f"{RUNS}{run_id} logged no tokenizer: its dev set cannot be encoded again")
        data = ClassificationDataModule(
            f, tok, seed=cfg.seed, limit_train=f.train_examples, cache_dir=cfg.data.cache_dir
        )
        data.setup("fit")
    scores = validate(scoring_module(cfg, stored.model), cfg, data)  # the quantized classifier, as the run scored it
    return {f"{f.task}/final_{f.metric}": scores[f"{f.task}/{f.metric}"]}
