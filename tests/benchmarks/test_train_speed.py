"""The benchmark's sides do the same work: from the same weights on the same batches, ablate
and transformers (every attention and precision setting) give the same losses. No timing here:
speed is measured by ``ablate bench``, never by the test suite."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ablate.benchmarks.cases import CASES, Case, default_cases
from ablate.benchmarks.ceiling import step_flops
from ablate.benchmarks.train_speed import activation_mb, batches, build_sides, race, tokens_per_s
from ablate.benchmarks.train_table import FP32, _block


def _small(case: Case) -> Case:
    """The case at a test's size: same architecture family, fewer layers, a shorter sequence and a
    smaller vocabulary (training a 30k-word tokenizer and stepping its embeddings would take minutes)."""
    return replace(
        case, model=replace(case.model, num_layers=2, vocab_size=min(case.model.vocab_size, 2048)), seq_len=32, batch=4
    )


@pytest.mark.parametrize("name", list(CASES))
def test_sides_start_equal_and_stay_close(name, wiki_validation):
    import torch

    case = _small(CASES[name]())
    data = batches(case, str(wiki_validation), 4, torch.device("cpu"))
    # bf16 on this CPU takes seconds per step at the GPU-sized widths (H=768): there it is checked on a GPU
    bf16 = ["ablate:bf16", "transformers:eager:bf16"] if name in default_cases("cpu") else []
    sides = build_sides(case, [*FP32, *bf16], torch.device("cpu"), max_steps=4)
    race(sides, data, warmup=1, progress=lambda: None)
    ours = sides[0]
    assert ours.name == "ablate fp32" and len(ours.losses) == 4 and len(ours.times) == 3
    for side in sides:
        tol = 1e-4 if side.precision == "fp32" else 2e-2
        assert side.losses[0] == pytest.approx(ours.losses[0], abs=tol), side.name
        assert side.losses[-1] == pytest.approx(ours.losses[-1], rel=tol * 10), side.name
        assert tokens_per_s(side, data, 1) > 0
        side.activation_mb = activation_mb(side, data[0], torch.device("cpu"))
        assert side.activation_mb > 0
        side.flops = step_flops(side, data[1])
        assert side.flops > 0
    lines, _ = _block(name, case, sides, {s.name: tokens_per_s(s, data, 1) for s in sides}, 1e12, torch.device("cpu"))
    assert any("same work" in line and "ok at" in line for line in lines)
    assert any(line.startswith("| ablate fp32 |") and "%" in line for line in lines)  # MFU column
