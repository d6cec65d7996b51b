"""How far a training step could go on this machine: its work and the matmul peak.

A step's floating-point work (forward and backward, as torch's ``FlopCounterMode`` counts
matmuls and attention) divided by the machine's measured matmul throughput is the least
time the step could take if every FLOP ran at that peak and nothing else cost anything.
Against a measured reference step that gives a ceiling on the speed-up any implementation
of the same arithmetic could show. ``ablate bench train`` prints it beside the ratios, so a
missed target reads as "the work left" or "the machine", not as a guess.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.benchmarks.train_speed import Batch, Side


@dataclass(frozen=True)
class Ceiling:
    """Work and peak for one side.

    Attributes:
        flops: floating-point operations of one forward + backward.
        peak: the machine's matmul FLOP/s in the side's precision.
    """

    flops: float
    peak: float

    @property
    def min_step_s(self) -> float:
        """The step's time if all its work ran at the peak."""
        return self.flops / self.peak


def step_flops(side: Side, batch: Batch) -> float:
    """FLOPs of one forward + backward of ``side`` on ``batch`` (the optimizer step, a few
    element-wise passes over the parameters, is not counted)."""
    with FlopCounterMode(display=False) as counter:
        side.loss_only(batch).backward()
    for p in side.params:
        p.grad = None
    return float(counter.get_total_flops())


def matmul_peak(precision: str, device: torch.device, n: int = 2048, repeats: int = 10) -> float:
    """FLOP/s of an ``n x n x n`` matmul in ``precision`` (``fp32`` or ``bf16``): the best of
    ``repeats`` after a warm-up."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best
