"""Checkpoints inside a trial, so that a killed trial resumes where it was.

A study trial keeps its Lightning checkpoints in ``<tracking.root>/checkpoints/<study>/
<config sha256[:16]>/`` (any later attempt at the same resolved config finds them: a retry
after a dead worker, or the configuration requeued after Ctrl-C): ``last.ckpt`` and
``best.ckpt`` (lowest ``val/loss``), written at every validation; nothing else, so the
disk does not grow with the steps. A retry starts from ``last.ckpt``: weights, optimizer,
schedule, step, the random generators and the data stream's position, so its curve
continues and it ends where an uninterrupted trial does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from ablate.lightning_modules.config import ExperimentConfig, config_digest

LAST = "last.ckpt"


class RngState(Callback):
    """Save and restore the Python, NumPy, torch CPU and CUDA generators with each checkpoint
    (dropout; on a GPU dropout draws from the CUDA generator); on restore, also tell
    ``on_resume`` the checkpoint's step. A checkpoint's CUDA state is restored when this process
    has as many CUDA devices as the one that wrote it (else the CUDA generators start afresh)."""

    def __init__(self, on_resume: Callable[[int], None] | None = None) -> None:
        self.on_resume = on_resume

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        checkpoint["ablate_rng"] = {
            "python": random.getstate(),
            "torch": torch.get_rng_state(),  # weights_only-safe
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.on_resume is not None:
            self.on_resume(int(checkpoint["global_step"]))
        state = checkpoint.get("ablate_rng")
        if state is not None:
            random.setstate(state["python"])
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
            torch.set_rng_state(state["torch"])
            cuda = state.get("cuda") or []
            if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)


def trial_dir(root: str | Path, study: str, cfg: ExperimentConfig) -> Path:
    """Where the checkpoints of a trial with this resolved config live (shared by its retries)."""
    return Path(root) / "checkpoints" / study / config_digest(cfg)[:16]


def callbacks(folder: Path, on_resume: Callable[[int], None] | None = None) -> list[Callback]:
    """Keep ``last.ckpt`` and ``best.ckpt`` in ``folder``, written at each validation;
    ``on_resume(step)`` is called when a fit restores one."""
    return [
        ModelCheckpoint(
            dirpath=folder,
            filename="best",
            monitor="val/loss",
            mode="min",
            save_top_k=1,
            save_last=True,
            enable_version_counter=False,
        ),
        RngState(on_resume),
    ]


def resume_path(folder: Path | None) -> Path | None:
    """``last.ckpt`` of ``folder`` if an earlier attempt wrote one."""
    if folder is None:
        return None
    last = folder / LAST
    return last if last.is_file() else None
