"""The benchmark's sides do the same work: from the same weights on the same batches, ablate
and transformers (every attention and precision setting) give the same losses. No timing here:
speed is measured by ``ablate bench``, never by the test suite."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ablate.benchmarks.cases import CASES, Case, default_cases
from ablate.benchmarks.ceiling import Peaks, step_flops
from ablate.benchmarks.sides import build_sides
from ablate.benchmarks.train_speed import activation_mb, batches, race, tokens_per_s
from ablate.benchmarks.train_table import BF16, FP32, _block, settings_for


def _small(case: Case) -> Case:
    """The case at a test's size: same architecture family, fewer layers, a shorter sequence and a
    smaller vocabulary (training a 30k-word tokenizer and stepping its embeddings would take minutes)."""

    def small(model):  # T=32 fits (the micro case has 16 positions)
        return replace(model, num_layers=2, vocab_size=min(model.vocab_size, 2048), max_position=128)

    teacher = None if case.teacher is None else small(case.teacher)
    return replace(case, model=small(case.model), teacher=teacher, seq_len=32, batch=4)


@pytest.mark.parametrize("name", list(CASES))
def test_sides_start_equal_and_stay_close(name, wiki_validation):
    import torch

    case = _small(CASES[name]())
    data = batches(case, str(wiki_validation), 4, torch.device("cpu"))
    # bf16 on this CPU takes seconds per step at the GPU-sized widths (H=768): there it is checked on a GPU
    bf16 = [s for s in BF16 if "sdpa" not in s] if name in default_cases("cpu") else []
    settings = [s for s in [*FP32, *bf16] if case.teacher is None or "sdpa" not in s]  # distillation: eager only
    sides = build_sides(case, settings, torch.device("cpu"), max_steps=4)
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
    peak = Peaks({"fp32": 1e12, "bf16": 2e12}, ("fp32", "bf16"), ())
    lines, _ = _block(name, case, sides, {s.name: tokens_per_s(s, data, 1) for s in sides}, peak, torch.device("cpu"))
    assert any("same work" in line and "ok at" in line for line in lines)
    assert any(line.startswith("| ablate fp32 |") and "%" in line for line in lines)  # MFU column


def test_sides_leave_out_what_the_machine_has_no_fast_kernels_for():
    import torch

    cpu = torch.device("cpu")
    plain, distill = CASES["albert-tiny"](), CASES["distill-mini"]()
    assert settings_for(plain, cpu, False, ("fp32",)) == FP32
    assert settings_for(plain, cpu, True, ("fp32", "bf16")) == [
        *FP32,
        *BF16,
        "ablate:fp32:compile",
        "ablate:bf16:compile",
        "transformers:sdpa:fp32:compile",
        "transformers:sdpa:bf16:compile",
    ]
    # on CUDA the compiled sides are always there, transformers' among them (the ratios' best)
    assert "transformers:sdpa:bf16:compile" in settings_for(plain, torch.device("cuda"), False, ("fp32", "bf16"))
    # transformers' SDPA returns no attention probabilities: a distillation has no SDPA side
    assert settings_for(distill, cpu, False, ("fp32",)) == ["ablate:fp32", "transformers:eager:fp32"]
    assert all("cudagraphs" not in s for s in settings_for(distill, torch.device("cuda"), True, ("fp32", "bf16")))


def test_transformers_compiled_trains_the_same_batches_to_a_close_loss(wiki_validation):
    """transformers in torch.compile (the fastest way a user runs it) does the eager side's work: the same
    losses from the same weights on the same batches, and the table names it when it is the fastest."""
    import torch

    small = _small(CASES["bert-tiny"]())
    case = replace(small, model=replace(small.model, num_layers=1))  # one layer: compiling takes ~15 s here
    cpu = torch.device("cpu")
    data = batches(case, str(wiki_validation), 3, cpu)
    sides = build_sides(case, ["ablate:fp32", "transformers:sdpa:fp32", "transformers:sdpa:fp32:compile"], cpu, 3)
    race(sides, data, warmup=1, progress=lambda: None)
    eager, compiled = sides[1], sides[2]
    assert compiled.name == "transformers sdpa fp32 compiled" and compiled.library == "transformers"
    assert len(compiled.losses) == 3
    for a, b in zip(eager.losses, compiled.losses, strict=True):
        assert b == pytest.approx(a, abs=1e-3)
    for side in sides:
        side.flops = step_flops(side, data[1])
    speed = {s.name: 1.0 for s in sides} | {compiled.name: 2.0}  # say the compiled side was the fastest
    peak = Peaks({"fp32": 1e12}, ("fp32",), ())
    lines, _ = _block("bert-tiny", case, sides, speed, peak, cpu)
    assert any("transformers' best (transformers sdpa fp32 compiled)" in line for line in lines)
    assert any(line.startswith("| transformers sdpa fp32 compiled | 2 |") for line in lines)
