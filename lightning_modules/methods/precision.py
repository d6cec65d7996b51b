"""The fp32 matmul precision of a run (``trainer.matmul_precision``), set for the run and restored after.

torch keeps it process-wide (``torch.set_float32_matmul_precision``); a study worker runs many
trials in one process, so each run sets its own when it starts and gives the previous one back
when it ends: every trial, the first included, trains and is timed under its config's precision.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

MatmulPrecision = Literal["highest", "high", "medium"]


def resolved(precision: str, device_type: str) -> MatmulPrecision:
    """``trainer.matmul_precision`` on a device of type ``device_type``: ``auto`` is ``high`` (TF32
    tensor cores) on CUDA and ``highest`` elsewhere; any other value is itself."""
    if precision == "auto":
        return "high" if device_type == "cuda" else "highest"
    if precision not in ("highest", "high", "medium"):
        raise ValueError(f"trainer.matmul_precision: {precision!r} is not auto, highest, high or medium")
    return precision  # type: ignore[return-value]  # checked just above


@contextmanager
def matmul_precision(precision: MatmulPrecision) -> Iterator[None]:
    """fp32 matmuls at ``precision`` inside the block; the process's previous precision after it."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
