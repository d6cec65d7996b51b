"""How far a training step could go on this machine: its work and the matmul peak.

A step's floating-point work (forward and backward, as torch's ``FlopCounterMode`` counts
matmuls and attention) divided by the machine's measured matmul throughput is the least
time the step could take if every FLOP ran at that peak and nothing else cost anything.
Against a measured reference step that gives a ceiling on the speed-up any implementation
of the same arithmetic could show. ``ablate bench train`` prints it beside the ratios, so a
missed target reads as "the work left" or "the machine", not as a guess.

The peak is measured in each precision a side runs in, time-boxed (:func:`matmul_peak`): a
square matmul grows from 128 until one product takes a few milliseconds, then the best of a
few products at that size. A CPU without fast kernels for a precision (bf16 on a CPU without
AVX-512 BF16 or AMX runs at a few GFLOP/s) is found by that measurement: :func:`peaks` says
which precisions to leave out, and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.benchmarks.train_speed import Batch, Side

SLOW = 0.5  # a precision whose peak is under this share of fp32's has no fast kernels here: left out
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _product_s(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    a @ b
    _sync(device)
    return time.perf_counter() - start


def matmul_peak(
    precision: str, device: torch.device, budget_s: float = 0.5, min_product_s: float = 0.005, max_n: int | None = None
) -> float:
    """FLOP/s of a square matmul in ``precision`` (``fp32`` or ``bf16``), in about ``budget_s``.

    The side ``n`` doubles from 128 (up to ``max_n``: 8192 on CUDA, 2048 elsewhere) until one
    product takes ``min_product_s``; the best of the products at that size (after a warm-up
    one) gives the rate. A slow precision stops growing when the budget is spent, so the
    measurement never takes much longer than ``budget_s`` whatever the machine's speed.
    """
    dtype = DTYPES[precision]
    max_n = max_n or (8192 if device.type == "cuda" else 2048)
    deadline = time.perf_counter() + budget_s
    n, best = 128, 0.0
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        _product_s(a, b, device)  # warm-up: kernel choice, first-touch memory
        elapsed = _product_s(a, b, device)
        best = max(best, 2 * n**3 / elapsed)
        if elapsed >= min_product_s or n >= max_n or time.perf_counter() + 8 * elapsed > deadline:
            break
        n *= 2
    while time.perf_counter() + elapsed < deadline:  # the best of as many more as the budget allows
        elapsed = _product_s(a, b, device)
        best = max(best, 2 * n**3 / elapsed)
    return best


@dataclass(frozen=True)
class Peaks:
    """The measured matmul peak per precision, those with fast kernels here, and what was left out."""

    flops: dict[str, float]
    fast: tuple[str, ...]
    left_out: tuple[str, ...]

    def note(self) -> str:
        """One line for the output: the peaks, and what is left out and why."""
        rates = ", ".join(f"{p} {self.flops[p] / 1e9:,.0f} GFLOP/s" for p in self.flops)
        if not self.left_out:
            return f"measured matmul peaks: {rates}"
        gone = ", ".join(self.left_out)
        return (
            f"measured matmul peaks: {rates}; {gone} left out: this CPU has no fast {gone} matmul kernels"
            f" (under {SLOW:.0%} of fp32's rate; torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()})"
        )


def peaks(device: torch.device, precisions: tuple[str, ...] = ("fp32", "bf16"), budget_s: float = 0.3) -> Peaks:
    """The matmul peak in each of ``precisions`` (each in about ``budget_s``); on a CPU, a precision
    under ``SLOW`` of fp32's rate is left out (its sides would run for hours and say nothing)."""
    flops = {p: matmul_peak(p, device, budget_s) for p in precisions}
    slow = tuple(
        p for p in precisions if device.type == "cpu" and p != "fp32" and flops[p] < SLOW * flops.get("fp32", 0.0)
    )
    return Peaks(flops, tuple(p for p in precisions if p not in slow), slow)
