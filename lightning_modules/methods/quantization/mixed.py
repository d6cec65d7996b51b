"""Q-BERT's question at small scale: which layers need more bits? Each quantized layer's sensitivity
(``quant.sensitivity``: ``loss`` or ``hessian``) is measured on a few training batches; :func:`mixed_plan` gives
``quant.high_bits`` to the most sensitive layers while they fit ``quant.high_fraction`` of the quantized weights,
``quant.low_bits`` to the rest; docs/guides/quantization.md ("Mixed precision by sensitivity")."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pandas as pd
import torch
from torch import nn
from tqdm import tqdm

from ablate.lightning_modules.config.quant import QuantConfig
from ablate.lightning_modules.methods.quantization.apply import LayerBits, quantize_weights, targets
from ablate.lightning_modules.methods.quantization.hessian import Eigen, top_eigenvalues

Batch = dict[str, torch.Tensor]
BatchLoss = Callable[[nn.Module, Batch], torch.Tensor]
"""The loss of a model on one batch: a scalar tensor (with its graph when gradients are on)."""
Loss = Callable[[nn.Module], float]
"""The loss of a model on the calibration batches (lower is better)."""


def mean_loss(loss: BatchLoss, batches: Sequence[Batch]) -> Loss:
    """``loss`` averaged over ``batches``, in eval mode, without gradients."""

    def value(m: nn.Module) -> float:
        m.eval()
        with torch.inference_mode():
            return sum(float(loss(m, b)) for b in batches) / len(batches)

    return value


def sensitivity(model: nn.Module, loss: Loss, bits: int, group_size: int) -> dict[str, float]:
    """Per target layer, ``loss`` with that layer alone at ``bits`` minus ``loss`` of ``model``."""
    base = loss(model)
    out: dict[str, float] = {}
    for name in tqdm(targets(model), desc="layer sensitivity", unit="layer", delay=1.0, leave=False, disable=None):
        trial = quantize_weights(copy.deepcopy(model), {name: bits}, group_size)
        out[name] = loss(trial) - base
    return out


def mixed_plan(sizes: dict[str, int], scores: dict[str, float], q: QuantConfig) -> LayerBits:
    """Bits per layer: ``high_bits`` down the ranking while the layers so raised hold at most
    ``high_fraction`` of the weights (a layer that does not fit is passed over), ``low_bits`` else."""
    budget = q.high_fraction * sum(sizes.values())
    order = sorted(scores, key=lambda n: scores[n], reverse=q.rank == "sensitivity")
    plan, used = dict.fromkeys(sizes, q.low_bits), 0
    for name in order:
        if used + sizes[name] <= budget:
            plan[name], used = q.high_bits, used + sizes[name]
    return plan


def plan_table(
    model: nn.Module, scores: dict[str, float], plan: LayerBits, eigen: dict[str, Eigen] | None = None
) -> pd.DataFrame:
    """One row per quantized layer: weights, sensitivity, rank (1 = most sensitive) and bits; with
    ``eigen`` (Hessian sensitivity) the top eigenvalue's mean, std and per-batch values too."""
    layers = targets(model)
    table = pd.DataFrame(
        {
            "layer": list(layers),
            "weights": [m.weight.numel() for m in layers.values()],
            "sensitivity": [scores.get(n, float("nan")) for n in layers],
            "bits": [plan[n] for n in layers],
        }
    )
    table["rank"] = table["sensitivity"].rank(ascending=False, method="first").astype("Int64")
    if eigen is not None:
        table["eigenvalue_mean"] = [eigen[n].mean for n in layers]
        table["eigenvalue_std"] = [eigen[n].std for n in layers]
        table["eigenvalues"] = [" ".join(f"{v:.6g}" for v in eigen[n].values) for n in layers]
    return table


def average_bits(model: nn.Module, plan: LayerBits) -> float:
    """Bits per quantized weight under ``plan``, weighted by layer size."""
    sizes = {name: m.weight.numel() for name, m in targets(model).items()}
    return sum(sizes[n] * plan[n] for n in plan) / sum(sizes[n] for n in plan)


def choose_plan(
    model: nn.Module, loss: BatchLoss, batches: Sequence[Batch], q: QuantConfig
) -> tuple[LayerBits, pd.DataFrame]:
    """``weight-mixed``'s plan for ``model`` (left as it is), ranked on ``batches`` by ``loss`` as
    ``quant.sensitivity`` says, and the table that explains it."""
    eigen = None
    if q.sensitivity == "hessian":
        eigen = top_eigenvalues(model, targets(model), loss, batches, iters=q.hessian_iters)
        scores = {name: e.score for name, e in eigen.items()}
    else:
        scores = sensitivity(model, mean_loss(loss, batches), q.low_bits, q.group_size)
    sizes = {name: m.weight.numel() for name, m in targets(model).items()}
    plan = mixed_plan(sizes, scores, q)
    return plan, plan_table(model, scores, plan, eigen)
