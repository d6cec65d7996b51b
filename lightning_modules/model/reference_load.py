"""A fixed reference workload, timed beside every latency: was the machine slow while it measured?

A busy machine does not always show in a latency's spread: a model timed entirely beside someone
else's job gets repeats that agree with each other, all of them slow (a 2-core machine logged
724 ms and 98 ms for models an idle one times at 39 and 25). So :func:`ablate.lightning_modules.
profiling.time_forward` runs this workload once after every timed repeat of the model, on the
same device and threads, and keeps its times. The workload never changes (a few float32 matrix
products, the same inputs every time, no autocast), so on one machine its time only changes with
what else runs there: a run logs the fastest as ``latency_ms_b32_reference`` beside
``latency_ms_b32``, and a report marks a latency whose reference ran much slower than the
study's other runs' (``ablate.reports.tables.REFERENCE_LIMIT``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: ``latency_ms_b32_reference``: ms of the reference workload, the fastest of its runs beside
#: ``latency_ms_b32``'s repeats.
REFERENCE_SUFFIX = "_reference"
#: Side of the square float32 matrices and how many products one run of the workload takes: about
#: 0.13 GFLOP on a CPU (a few ms on two cores), 69 GFLOP on a GPU (about a millisecond).
CPU_SIZE, GPU_SIZE, PRODUCTS = 256, 2048, 4

Workload = Callable[[], object]


def reference_workload(device: torch.device | str) -> Workload:
    """The reference workload on ``device``: ``PRODUCTS`` products of two fixed square float32
    matrices (``GPU_SIZE`` on CUDA, else ``CPU_SIZE``), made once from a private generator (no
    global random stream moves), run outside any autocast. Calling it runs it once; the caller
    synchronizes and times."""
    dev = torch.device(device)
    n = GPU_SIZE if dev.type == "cuda" else CPU_SIZE
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dev)
    b = torch.randn(n, n, generator=g).to(dev) / n**0.5  # products stay bounded

    def run() -> torch.Tensor:
        with torch.autocast(dev.type, enabled=False):
            out = a
            for _ in range(PRODUCTS):
                out = out @ b
            return out

    return run
