"""The sides a speed benchmark races, for any case: a pre-training case's
(:func:`~ablate.benchmarks.train_speed.build_pretrain_sides`) or a distillation case's, teacher forward
plus student step (:func:`~ablate.benchmarks.distill_speed.build_distill_sides`)."""

from __future__ import annotations

import torch

from ablate.benchmarks.cases import Case
from ablate.benchmarks.distill_speed import build_distill_sides
from ablate.benchmarks.train_speed import Side, build_pretrain_sides
from ablate.lightning_modules.methods.train_module import use_tensor_cores


def build_sides(case: Case, settings: list[str], device: torch.device, max_steps: int, seed: int = 0) -> list[Side]:
    """The sides named by ``settings``, all from one initialisation; on CUDA both sides run fp32 matmuls
    on TF32 (the bench's process only)."""
    use_tensor_cores(device)
    build = build_pretrain_sides if case.teacher is None else build_distill_sides
    return build(case, settings, device, max_steps, seed)
