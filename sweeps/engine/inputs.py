"""What a run reads before it exists: its corpus and tokenizer, the model it starts from, the sources
it prunes or quantizes, each checked against the run (tokenizer, positions, group size)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import cast

from ablate.datamodules.catalog import resolve_model
from ablate.datamodules.pretrain import PretrainDataModule
from ablate.datamodules.tokenizer import checkpoint_tokenizer, run_vocab_size
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.quant import check_group_size
from ablate.lightning_modules.interop.hub import same_vocabulary
from ablate.lightning_modules.interop.pretrained import different_tokenizer, initial_model
from ablate.lightning_modules.measure.measuring import training_device
from ablate.lightning_modules.methods.quantization.apply import check_quantizable, prepare_qat
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model
from ablate.sweeps.engine.sources import Source, check_positions, check_same_tokenizer, load_source


def corpus(cfg: ExperimentConfig) -> PretrainDataModule:
    """The run's corpus stream, tokenizer trained or read from the cache, ready to fit."""
    data = PretrainDataModule(
        cfg.data, cfg.objective, run_vocab_size(cfg), cfg.seed, val_batches=cfg.trainer.val_batches
    )
    data.prepare_data()
    data.setup("fit")
    return data


def tokenizer_of(data: PretrainDataModule) -> Path:
    """The tokenizer file ``data`` trained or read (set up by :func:`corpus`)."""
    assert data.tokenizer_path is not None, "the data module is set up"
    return Path(data.tokenizer_path)


def student(cfg: ExperimentConfig, tokenizer: Path) -> PretrainingModel | None:
    """The model a pre-training or distillation run trains: ``init_from``'s weights (None: the module
    builds it from random weights), fake-quantized from the first step with ``quant.method: qat-int8``."""
    start = initial_model(cfg, tokenizer, _init_folder(cfg, tokenizer))
    if cfg.quant.method != "qat-int8":
        return start
    model = start if start is not None else build_pretraining_model(cfg.model, cfg.objective)
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


def checked_source(cfg: ExperimentConfig, name: str, field: str, uri: str, tokenizer: Path) -> Source:
    """The model ``name`` (the value of config field ``field``: ``prune.source``, ``quant.source``),
    loaded and checked against this run's tokenizer and sequence length, before the run exists."""
    with tempfile.TemporaryDirectory(prefix="ablate-source-") as tmp:
        source = load_source(name, uri, Path(tmp), field=field)
        check_same_tokenizer(source, tokenizer, field=field)
        check_positions(source, cfg.data.max_length, field=field)
    try:
        check_group_size(cfg.quant, source.model_cfg)
        check_quantizable(source.model, cfg.quant, f"the model of {field}")
    except ValueError as exc:
        raise ConfigError(f"{exc} (the model of {field})") from None
    return source


def task_workers(cfg: ExperimentConfig) -> int:
    """The task loader's workers: ``data.num_workers`` on a GPU, where collating in the main process
    between steps leaves the device idle; none on a CPU, whose cores the step uses (its loop runs at
    the step's speed without them: ``ablate bench loop --regime finetune``)."""
    return cfg.data.workers(cfg.trainer.devices) if training_device(cfg.trainer.accelerator).type == "cuda" else 0
