"""Q-BERT's layer sensitivity (Shen et al. 2020): the top eigenvalue of the loss's Hessian with respect to each
layer's weight, by power iteration on Hessian-vector products (double backprop) on several batches
(:func:`top_eigenvalues`), ranked by its mean plus standard deviation over the batches (:attr:`Eigen.score`);
docs/guides/quantization.md ("Mixed precision by sensitivity")."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

B = TypeVar("B")

Loss = Callable[[nn.Module, B], torch.Tensor]
"""The loss of a model on one batch: a scalar tensor with its graph (lower is better)."""


@dataclass(frozen=True)
class Eigen:
    """One layer's top Hessian eigenvalue over the batches.

    Attributes:
        values: the eigenvalue on each batch, in the batches' order (signed: see :func:`top_eigenvalues`).
    """

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    @property
    def std(self) -> float:
        """The population standard deviation (0 for one batch), as PyHessian's ``np.std``."""
        return math.sqrt(math.fsum((v - self.mean) ** 2 for v in self.values) / len(self.values))

    @property
    def score(self) -> float:
        """Q-BERT's ranking score: mean + std (higher: more sensitive, more bits)."""
        return self.mean + self.std


def _weight(model: nn.Module, name: str) -> nn.Parameter:
    try:
        module = model.get_submodule(name)
    except AttributeError as e:
        raise ValueError(f"{name!r} is not a module of the model") from e
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter):
        raise ValueError(f"module {name!r} has no weight parameter (a {type(module).__name__})")
    return weight


def _power_iteration(g: torch.Tensor, w: torch.Tensor, iters: int, tol: float, seed: int, shift: float = 0.0) -> float:
    """The largest-magnitude eigenvalue of H - shift*I, plus shift, with H = dg/dw and g = dL/dw (shape
    (out, in), like w) still on its graph: v <- (H - shift*I) v / |...| from a random unit v (out, in), the
    estimate being the Rayleigh quotient v.(H - shift*I)v."""
    if not g.requires_grad:  # L is linear in w: its Hessian block is zero
        return 0.0
    v = torch.randn(w.shape, generator=torch.Generator().manual_seed(seed)).to(w)  # on the CPU: any device alike
    v = v / v.norm()
    estimate = 0.0
    for step in range(iters):
        (hv,) = torch.autograd.grad(g, w, grad_outputs=v, retain_graph=True, materialize_grads=True)  # H v
        hv = hv - shift * v
        new = float((v * hv).sum())
        if step > 0 and abs(new - estimate) < tol * abs(estimate):
            return new + shift
        estimate = new
        norm = hv.norm()
        if norm == 0:  # v in the null space
            break
        v = hv / norm
    return estimate + shift


def top_eigenvalues(
    model: nn.Module,
    names: Iterable[str],
    loss: Loss[B],
    batches: Sequence[B],
    iters: int = 100,
    tol: float = 1e-3,
    seed: int = 0,
    largest: bool = True,
) -> dict[str, Eigen]:
    """The top eigenvalue of the Hessian of ``loss`` with respect to each named module's ``.weight`` (bias
    excluded; the block of that weight alone, shape (out*in, out*in) for a Linear) on each batch.

    Power iteration on Hessian-vector products: from a random unit start (the same for a layer on every
    batch, drawn from a generator seeded by ``seed``: same seed, same numbers) it runs until the estimate
    changes by less than ``tol`` (relative) or for ``iters`` products. It finds the eigenvalue of largest
    magnitude; with ``largest`` (Q-BERT's top eigenvalue), where that one is negative, a second run on
    H - eigenvalue*I (whose eigenvalues are all about >= 0) finds the largest one. ``largest=False`` returns the
    largest-magnitude one with its sign, as PyHessian does. Near a minimum (a trained model) the Hessian is
    about positive semi-definite and the two agree; at a random init they often do not. Convergence is
    geometric in the ratio of the two eigenvalues of largest magnitude: where it is near 1 (the largest and
    most negative eigenvalues of about the same size) ``iters`` may end it before ``tol`` is met.

    Per batch the loss is computed once and its gradients with respect to all the named weights in one
    backward with ``create_graph``; each layer's power iteration then runs on that graph. A layer's gradient
    depends on the whole network above it, so one layer at a time would keep about the same graph (the peak
    memory: the forward's activations and the backward's graph) while repeating the forward and backward
    once per layer.

    The model runs in eval mode (dropout off) and on PyTorch's math attention (the fused kernels have no
    double backward); its modes and its weights' ``requires_grad`` are restored and no ``.grad`` is written.

    Raises:
        ValueError: a name that is not a module with a ``weight`` parameter, no batches, ``iters`` < 1, a
            loss that is not a scalar or does not depend on a named weight.
    """
    if not batches:
        raise ValueError("top_eigenvalues needs at least one batch")
    if iters < 1:
        raise ValueError(f"iters must be at least 1, not {iters}")
    weights = {name: _weight(model, name) for name in names}
    values: dict[str, list[float]] = {name: [] for name in weights}
    if not weights:
        return {}
    total = len(batches) * len(weights)
    with (
        _eval_with_weight_grads(model, list(weights.values())),
        tqdm(total=total, desc="Hessian eigenvalues", unit="layer", delay=1.0, leave=False, disable=None) as bar,
    ):
        for batch in batches:
            with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
                grads = _weight_grads(model, list(weights.values()), loss, batch)
                for (name, w), g in zip(weights.items(), grads, strict=True):
                    values[name].append(_layer_eigenvalue(name, g, w, iters, tol, seed, largest))
                    bar.update()
    return {name: Eigen(tuple(v)) for name, v in values.items()}


@contextmanager
def _eval_with_weight_grads(model: nn.Module, weights: list[nn.Parameter]) -> Iterator[None]:
    """``model`` in eval mode (dropout off) and ``weights`` requiring grad meanwhile; both restored after."""
    modes = [(m, m.training) for m in model.modules()]
    flags = [(w, w.requires_grad) for w in weights]
    try:
        model.eval()
        for w in weights:
            w.requires_grad_(True)
        yield
    finally:
        for m, training in modes:
            m.training = training
        for w, flag in flags:
            w.requires_grad_(flag)


def _weight_grads(model: nn.Module, weights: list[nn.Parameter], loss: Loss[B], batch: B) -> list[torch.Tensor | None]:
    """The gradients of ``loss`` on ``batch`` with respect to ``weights``, in one backward with ``create_graph``
    (None for a weight the loss does not depend on)."""
    value = loss(model, batch)
    if value.dim() != 0:
        raise ValueError(f"the loss must be a scalar, not of shape {tuple(value.shape)}")
    return list(torch.autograd.grad(value, weights, create_graph=True, allow_unused=True))


def _layer_eigenvalue(
    name: str, g: torch.Tensor | None, w: nn.Parameter, iters: int, tol: float, seed: int, largest: bool
) -> float:
    """The top eigenvalue of the Hessian block of ``w`` (module ``name``), from its gradient ``g`` on its graph."""
    if g is None:
        raise ValueError(f"the loss does not depend on {name}.weight")
    eigenvalue = _power_iteration(g, w, iters, tol, seed)
    if largest and eigenvalue < 0:  # the most negative: the largest is H - eigenvalue*I's top
        eigenvalue = _power_iteration(g, w, iters, tol, seed, shift=eigenvalue)
    return eigenvalue
