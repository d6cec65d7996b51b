"""How far a training step could go on this machine: its FLOPs (``FlopCounterMode``) over the measured
matmul peak per precision (:func:`matmul_peak`, time-boxed; :func:`peaks` leaves out a precision the CPU
has no fast kernels for, and says why), a bound on any speed-up for the same arithmetic that ``ablate
bench train`` prints beside its ratios (docs/performance.md, "Work per step and the ceiling it sets")."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.benchmarks.train_speed import Batch, Side

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
        side.loss_only(batch).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
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
    precision: str,
    device: torch.device,
    budget_s: float = 0.3,
    min_product_s: float = 0.02,
    min_n: int = 512,
    max_n: int | None = None,
) -> float:
    """FLOP/s of a square matmul in ``precision`` (``fp32`` or ``bf16``), in about ``budget_s``.

    The side ``n`` doubles from 256 (to at least ``min_n`` and at most ``max_n``: 8192 on CUDA,
    2048 elsewhere) until one product takes ``min_product_s``; the best of the products at that
    size (after a warm-up one) gives the rate. A slow precision stops growing when the budget
    is spent, so the measurement never takes much longer than ``budget_s`` whatever the speed.
    """
    dtype = DTYPES[precision]
    max_n = max_n or (8192 if device.type == "cuda" else 2048)
    deadline = time.perf_counter() + budget_s
    n, best = 256, 0.0
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        _product_s(a, b, device)  # warm-up: kernel choice, first-touch memory
        elapsed = _product_s(a, b, device)
        best = max(best, 2 * n**3 / elapsed)
        grow = elapsed < min_product_s or n < min_n
        if not grow or n >= max_n or time.perf_counter() + 8 * elapsed > deadline:
            break
        n *= 2
    while time.perf_counter() + elapsed < deadline:  # the best of as many more as the budget allows
        elapsed = _product_s(a, b, device)
        best = max(best, 2 * n**3 / elapsed)
    return best


def fast_kernels(precision: str, device: torch.device) -> bool:
    """Whether ``device`` has fast matmul kernels for ``precision``: always for fp32 and on a GPU;
    bf16 on a CPU only with AVX-512 BF16 or AMX."""
    if precision == "fp32" or device.type != "cpu":
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@dataclass(frozen=True)
class Peaks:
    """The measured matmul peak per precision with fast kernels here, and those left out."""

    flops: dict[str, float]
    fast: tuple[str, ...]
    left_out: tuple[str, ...]

    def best(self, other: Peaks) -> Peaks:
        """The higher of two measurements per precision (a busy machine only ever slows a matmul down)."""
        flops = {p: max(self.flops[p], other.flops.get(p, 0.0)) for p in self.flops}
        return Peaks(flops, self.fast, self.left_out)

    def note(self) -> str:
        """One line for the output: the peaks, and what is left out and why."""
        rates = ", ".join(f"{p} {self.flops[p] / 1e9:,.0f} GFLOP/s" for p in self.fast)
        if not self.left_out:
            return f"measured matmul peaks: {rates}"
        gone = ", ".join(self.left_out)
        return (
            f"measured matmul peaks: {rates}; {gone} left out: this CPU has no fast {gone} matmul kernels "
            f"(no AVX-512 BF16 or AMX; torch CPU capability {torch.backends.cpu.get_cpu_capability()})"
        )


def peaks(device: torch.device, precisions: tuple[str, ...] = ("fp32", "bf16"), budget_s: float = 0.3) -> Peaks:
    """The matmul peak in each of ``precisions`` this device has fast kernels for (each in about
    ``budget_s``); the others are left out (their sides would run for hours and say nothing)."""
    fast = tuple(p for p in precisions if fast_kernels(p, device))
    return Peaks(
        {p: matmul_peak(p, device, budget_s) for p in fast}, fast, tuple(p for p in precisions if p not in fast)
    )
