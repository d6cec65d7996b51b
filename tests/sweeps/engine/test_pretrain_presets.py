"""Every MobileBERT-family preset (and the CPU ones) builds and trains a few steps on Wikipedia text."""

from __future__ import annotations

import math

import pytest

from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.runner import train


@pytest.mark.parametrize(
    "preset", ["mobilebert", "mobilebert-tiny", "ibbert-large", "mobilebert-mini", "albert-tiny", "bert-tiny"]
)
def test_preset_trains_a_few_steps(preset, tmp_path_factory, wiki_validation):
    shared = tmp_path_factory.getbasetemp() / "preset-runs"
    cfg = build_config(
        {
            "model": {"preset": preset},
            "data": {
                "corpus": str(wiki_validation),
                "max_length": 32,
                "batch_size": 2,
                "tokenizer_docs": 400,
                "num_workers": 0,
                "shuffle_buffer": 10,
                "cache_dir": str(shared / "cache"),
            },
            "optim": {"warmup_steps": 1},
            "trainer": {
                "max_steps": 2,
                "val_every": 2,
                "val_batches": 1,
                "progress": False,
                "measure": preset not in ("mobilebert", "mobilebert-tiny", "ibbert-large"),
            },  # CPU-costly
            "tracking": {"root": str(shared / "runs"), "experiment": "presets"},
        }
    )
    result = train(cfg)
    assert math.isfinite(result.metrics["val/loss"]) and math.isfinite(result.metrics["train/loss"])
