"""A fixed reference workload, timed beside every latency: was the machine slow while it measured? A
machine busy the whole time gives repeats that agree, all slow, so
:func:`ablate.lightning_modules.measure.profiling.time_forward` runs this never-changing workload after
every timed repeat (docs/reports.md, "The reference marker", says why it is built as it is)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

#: ``latency_ms_b32_reference``: ms of the reference workload, the median of its runs beside
#: ``latency_ms_b32``'s repeats.
REFERENCE_SUFFIX = "_reference"
#: (tokens, width, layers) of the stack: on a CPU about 0.4 GFLOP (a ninth of a quickstart forward at
#: batch 32); on a GPU about 50 GFLOP.
CPU_SHAPE, GPU_SHAPE = (256, 128, 12), (2048, 512, 12)

Workload = Callable[[], object]


def reference_workload(device: torch.device | str) -> Workload:
    """The reference workload on ``device``: ``layers`` times ``x = LayerNorm(x + GELU(x W1) W2)`` on
    fixed ``tokens x width`` float32 inputs (W1: width x 2 width), made once from a private generator
    (no global random stream moves), run outside any autocast. Calling it runs it once and returns
    the result; the caller synchronizes and times."""
    dev = torch.device(device)
    tokens, width, layers = GPU_SHAPE if dev.type == "cuda" else CPU_SHAPE
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(tokens, width, generator=g).to(dev)
    w1 = (torch.randn(width, 2 * width, generator=g) / width**0.5).to(dev)
    w2 = (torch.randn(2 * width, width, generator=g) / (2 * width) ** 0.5).to(dev)

    def run() -> torch.Tensor:
        with torch.autocast(dev.type, enabled=False):
            x = x0
            for _ in range(layers):
                x = F.layer_norm(x + F.gelu(x @ w1) @ w2, (width,))
            return x

    return run
