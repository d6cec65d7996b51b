"""A bare Lightning Trainer for tests that fit a small module: on the CPU, without a logger, checkpoints,
progress bar or model summary."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


def bare_trainer(
    max_steps: int,
    val_every: int,
    val_batches: int,
    callbacks: Sequence[Callback] = (),
    sanity_steps: int = 0,
    root: Path | None = None,
) -> pl.Trainer:
    """A Trainer of ``max_steps`` steps validating ``val_batches`` batches every ``val_every`` steps
    (``sanity_steps``: Lightning's sanity check before the fit; ``root``: its default folder)."""
    return pl.Trainer(
        max_steps=max_steps,
        val_check_interval=val_every,
        limit_val_batches=val_batches,
        num_sanity_val_steps=sanity_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        callbacks=list(callbacks),
        default_root_dir=root,
    )
