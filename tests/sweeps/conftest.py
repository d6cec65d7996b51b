"""A tiny study on real text, written into a temporary folder with its own MLflow/Optuna stores."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import yaml


def tiny_base(tmp_path: Path, corpus: Path, **trainer) -> dict:
    return {
        "model": {
            "preset": "albert-tiny",
            "vocab_size": 1000,
            "embed_dim": 16,
            "hidden_dim": 32,
            "num_layers": 2,
            "num_heads": 2,
            "ffn_dim": 64,
            "max_position": 64,
        },
        "objective": {"sentence": "sop"},
        "data": {
            "corpus": str(corpus),
            "max_length": 64,
            "batch_size": 8,
            "tokenizer_docs": 300,
            "num_workers": 0,
            "shuffle_buffer": 50,
            "cache_dir": str(tmp_path / "cache"),
        },
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "trainer": {"max_steps": 6, "val_every": 3, "val_batches": 2, "log_every": 2, "progress": False, **trainer},
        "tracking": {"root": str(tmp_path / "runs")},
    }


def write_study(
    tmp_path: Path, corpus: Path, name: str = "tiny", search: dict | None = None, trainer: dict | None = None, **extra
) -> Path:
    study = {
        "name": name,
        "base": tiny_base(tmp_path, corpus, **(trainer or {})),
        "search": search or {"model.sharing": {"choices": ["all", "none"]}},
        "seeds": [0],
        "sampler": "grid",
        "pruner": {"type": "none"},
        "optimize": {"metric": "val/loss", "direction": "minimize"},
        "report": {
            "title": "tiny",
            "rows": ["model.sharing"],
            "metrics": [
                {"name": "params.backbone", "format": "millions", "better": "lower"},
                {"name": "val/mlm_acc", "format": "percent", "better": "higher"},
                {"name": "val/sentence_acc", "format": "percent"},
                {"name": "val/loss", "better": "lower"},
            ],
            "plots": [{"x": "params.backbone", "y": "val/mlm_acc"}],
        },
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.fixture()
def study_file(tmp_path, wiki_validation) -> Path:
    return write_study(tmp_path, wiki_validation)


def trained_run(tmp_path: Path, corpus: Path, model: dict | None = None) -> tuple[dict, object]:
    """A tiny model trained on real text (no measurement): the base tree and its RunResult, for runs
    that start from a trained model (distillation teachers, pruning and fine-tuning sources)."""
    from ablate.lightning_modules.config.load import build_config
    from ablate.sweeps.engine.runner import train

    base = tiny_base(tmp_path, corpus)
    if model is not None:
        base["model"] = model
    base["trainer"]["measure"] = False
    return base, train(build_config(base))


class InterruptAt(pl.Callback):
    """Ctrl-C at a step, as a killed process would stop (after the checkpoint before it)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise KeyboardInterrupt
