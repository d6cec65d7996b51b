"""The random generators a trial checkpoint carries (sweeps.checkpoints.RngState), on the CPU.

The GPU half (a resumed CUDA trial ends where an uninterrupted one does) is in tests/test_gpu.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from ablate.sweeps.checkpoints import RngState


def _saved() -> dict:
    checkpoint: dict = {"global_step": 7}
    RngState().on_save_checkpoint(None, None, checkpoint)  # type: ignore[arg-type]
    return checkpoint


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_the_checkpoint_carries_every_generator_and_loads_weights_only(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    checkpoint = _saved()
    state = checkpoint["ablate_rng"]
    assert set(state) == {"python", "numpy", "torch", "cuda"}
    # CUDA's generators when CUDA is in use (one state per device), else none
    assert len(state["cuda"]) == (torch.cuda.device_count() if torch.cuda.is_initialized() else 0)
    path = tmp_path / "last.ckpt"
    torch.save(checkpoint, path)
    loaded = torch.load(path, weights_only=True)  # what a resume reads: plain tensors and tuples only
    expected = _draws()
    steps = []
    RngState(on_resume=steps.append).on_load_checkpoint(None, None, loaded)  # type: ignore[arg-type]
    assert _draws() == expected and steps == [7]


def test_a_checkpoint_without_cuda_state_or_from_other_devices_still_loads() -> None:
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    checkpoint = _saved()
    expected = _draws()
    old = {**checkpoint, "ablate_rng": {k: v for k, v in checkpoint["ablate_rng"].items() if k != "cuda"}}
    RngState().on_load_checkpoint(None, None, old)  # type: ignore[arg-type]  # written before CUDA state was saved
    assert _draws() == expected
    # from a machine with another number of GPUs (or here, without any): CPU streams restored, CUDA's left alone
    other = {
        **checkpoint,
        "ablate_rng": {
            **checkpoint["ablate_rng"],
            "cuda": [torch.zeros(16, dtype=torch.uint8)] * (torch.cuda.device_count() + 1),
        },
    }
    RngState().on_load_checkpoint(None, None, other)  # type: ignore[arg-type]
    assert _draws() == expected
    RngState().on_load_checkpoint(None, None, {"global_step": 3})  # type: ignore[arg-type]  # no ablate state at all
