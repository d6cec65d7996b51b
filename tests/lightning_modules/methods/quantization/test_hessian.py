"""Q-BERT's Hessian sensitivity: power iteration against the full Hessian block built directly, determinism,
mean and std over batches, the model left as it was, and the errors."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from ablate.lightning_modules.config.experiment import ObjectiveConfig
from ablate.lightning_modules.config.presets import get_preset
from ablate.lightning_modules.measure.measuring import random_batch
from ablate.lightning_modules.methods.quantization.apply import targets
from ablate.lightning_modules.methods.quantization.hessian import Eigen, top_eigenvalues
from ablate.lightning_modules.model.heads import build_pretraining_model

TIGHT = {"iters": 300, "tol": 1e-6}  # converged: what the full Hessian is compared with


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def mlp_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g)


def cross_entropy(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(b[0]), b[1])


V = 100


def ablate_model(preset: str = "bert-tiny", **overrides) -> nn.Module:
    """The real model, small: hidden 8, so its largest layer (qkv, 24 x 8) has a 192 x 192 Hessian."""
    small = {"vocab_size": V, "embed_dim": 8, "hidden_dim": 8, "num_layers": 1, "num_heads": 2, "ffn_dim": 16}
    torch.manual_seed(0)
    cfg = dataclasses.replace(get_preset(preset), **{**small, "max_position": 64, "dropout": 0.0, **overrides})
    return build_pretraining_model(cfg, ObjectiveConfig()).eval()


def batch(seed: int = 0, vocab: int = V) -> dict[str, torch.Tensor]:
    return random_batch(vocab, 4, 16, torch.device("cpu"), seed=seed)


def mlm_loss(model: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(b).mlm_loss


def hessian_eigenvalues(model: nn.Module, name: str, loss, b) -> torch.Tensor:
    """Every eigenvalue (ascending) of the loss's Hessian w.r.t. ``name``'s weight, from the full matrix."""
    w = model.get_submodule(name).weight.detach().clone()

    def of(w_: torch.Tensor) -> torch.Tensor:  # the loss as a function of the weight alone
        class WithWeight(nn.Module):
            def forward(self, x):
                return functional_call(model, {f"{name}.weight": w_}, (x,))

        with sdpa_kernel(SDPBackend.MATH):  # the fused attention kernels have no double backward
            return loss(WithWeight(), b)

    h = torch.autograd.functional.hessian(of, w).reshape(w.numel(), w.numel()).double()
    return torch.linalg.eigvalsh((h + h.T) / 2)


def relative_error(got: float, want: float) -> float:
    return abs(got - want) / abs(want)


# --- the power iteration against the full Hessian ----------------------------------------------


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("name", ["0", "2"])  # 5 -> 4 (indefinite: its most negative eigenvalue dominates), 4 -> 3
def test_an_mlp_layer_matches_the_eigenvalues_of_its_full_hessian(name, largest):
    model, b = mlp(), mlp_batch()
    eigenvalues = hessian_eigenvalues(model, name, cross_entropy, b)
    want = float(eigenvalues[-1] if largest else eigenvalues[eigenvalues.abs().argmax()])
    got = top_eigenvalues(model, [name], cross_entropy, [b], **TIGHT, largest=largest)[name].values[0]
    assert relative_error(got, want) < 1e-2
    if name == "0":  # the case that tells the two apart
        assert float(eigenvalues[0]) < 0 < float(eigenvalues[-1]) < -float(eigenvalues[0])
        assert (got > 0) == largest


def test_each_layer_of_the_ablate_model_matches_the_eigenvalues_of_its_full_hessian():
    model, b = ablate_model(), batch()
    names = list(targets(model))
    tight_top = top_eigenvalues(model, names, mlm_loss, [b], **TIGHT)
    tight_magnitude = top_eigenvalues(model, names, mlm_loss, [b], **TIGHT, largest=False)
    defaults = top_eigenvalues(model, names, mlm_loss, [b])
    for name in names:
        eigenvalues = hessian_eigenvalues(model, name, mlm_loss, b)
        top, magnitude = float(eigenvalues[-1]), float(eigenvalues[eigenvalues.abs().argmax()])
        assert relative_error(tight_top[name].values[0], top) < 1e-2, name
        assert relative_error(tight_magnitude[name].values[0], magnitude) < 1e-2, name
        assert relative_error(defaults[name].values[0], top) < 1e-2, name  # on this model, also 100 / 1e-3


def test_a_weight_the_loss_is_linear_in_has_a_zero_eigenvalue():
    model = mlp()
    summed = lambda m, b: m(b[0]).sum()  # noqa: E731 - linear in the last layer's weight
    out = top_eigenvalues(model, ["0", "2"], summed, [mlp_batch()])
    assert out["2"].values == (0.0,)
    assert out["0"].values[0] != 0.0


# --- determinism, batches ----------------------------------------------------------------------


def test_the_same_seed_gives_the_same_numbers_whatever_else_is_asked():
    model, bs = ablate_model(), [batch(0), batch(1)]
    names = list(targets(model))
    first = top_eigenvalues(model, names, mlm_loss, bs, iters=10, seed=3)
    assert top_eigenvalues(model, names, mlm_loss, bs, iters=10, seed=3) == first
    alone = top_eigenvalues(model, names[-1:], mlm_loss, bs, iters=10, seed=3)
    assert alone[names[-1]].values == pytest.approx(first[names[-1]].values, rel=1e-5)
    other = top_eigenvalues(model, names, mlm_loss, bs, iters=10, seed=4)
    assert other != first


def test_mean_and_std_are_over_the_per_batch_values():
    model, bs = mlp(), [mlp_batch(s) for s in range(3)]
    out = top_eigenvalues(model, ["0", "2"], cross_entropy, bs)
    for name, eigen in out.items():
        one_by_one = [top_eigenvalues(model, [name], cross_entropy, [b])[name].values[0] for b in bs]
        assert eigen.values == pytest.approx(one_by_one, rel=1e-9)
        assert eigen.mean == pytest.approx(statistics.fmean(one_by_one))
        assert eigen.std == pytest.approx(statistics.pstdev(one_by_one))
        assert eigen.score == pytest.approx(eigen.mean + eigen.std)
        assert eigen.std > 0


def test_eigen_summarises_its_values():
    assert (Eigen((1.0, 3.0)).mean, Eigen((1.0, 3.0)).std, Eigen((1.0, 3.0)).score) == (2.0, 1.0, 3.0)
    assert Eigen((-0.5,)).std == 0.0 and Eigen((-0.5,)).score == -0.5


@pytest.mark.parametrize(("preset", "overrides"), [("bert-tiny", {}), ("albert-tiny", {"sharing": "all"})])
def test_every_quantized_layer_of_a_tiny_model_gets_a_finite_positive_score(preset, overrides):
    small = {"embed_dim": 32, "hidden_dim": 32, "num_layers": 2, "ffn_dim": 64, "vocab_size": 1000}
    model = ablate_model(preset, **{**small, **overrides})
    out = top_eigenvalues(model, targets(model), mlm_loss, [batch(0, 1000), batch(1, 1000)], iters=20)
    assert list(out) == list(targets(model))
    for name, eigen in out.items():
        assert len(eigen.values) == 2
        assert all(math.isfinite(v) and v > 0 for v in eigen.values), name  # largest: > 0 where H is indefinite


# --- the model is left as it was ---------------------------------------------------------------


def test_the_model_is_left_as_it_was_and_runs_without_dropout():
    model = ablate_model(dropout=0.1)
    names = list(targets(model))
    frozen = model.get_submodule(names[0]).weight
    frozen.requires_grad_(False)
    model.get_submodule(names[1]).bias.requires_grad_(False)
    model.train()
    model.get_submodule(names[2]).eval()
    modes = {n: m.training for n, m in model.named_modules()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}

    with torch.no_grad():  # it turns gradients on for itself
        got = top_eigenvalues(model, names, mlm_loss, [batch()], iters=10)

    assert {n: m.training for n, m in model.named_modules()} == modes
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    assert top_eigenvalues(model, [], cross_entropy, [mlp_batch()]) == {}
    assert top_eigenvalues(model.eval(), names, mlm_loss, [batch()], iters=10) == got  # dropout was off


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "message"), [(["3"], "not a module"), (["0.nope"], "not a module"), (["1"], "no weight parameter")]
)
def test_a_name_that_is_not_a_module_with_a_weight_is_refused(names, message):
    with pytest.raises(ValueError, match=message):
        top_eigenvalues(mlp(), names, cross_entropy, [mlp_batch()])


class WithSpare(nn.Module):
    """The MLP and a layer its forward does not use."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.spare = mlp(), nn.Linear(2, 2).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_bad_batches_losses_and_iters_are_refused():
    model = WithSpare()
    with pytest.raises(ValueError, match="at least one batch"):
        top_eigenvalues(model, ["net.0"], cross_entropy, [])
    with pytest.raises(ValueError, match="iters"):
        top_eigenvalues(model, ["net.0"], cross_entropy, [mlp_batch()], iters=0)
    with pytest.raises(ValueError, match="scalar"):
        top_eigenvalues(model, ["net.0"], lambda m, b: m(b[0]), [mlp_batch()])
    with pytest.raises(ValueError, match="does not depend on spare.weight"):
        top_eigenvalues(model, ["net.0", "spare"], cross_entropy, [mlp_batch()])
    assert all(p.grad is None for p in model.parameters())
    assert top_eigenvalues(model, [], cross_entropy, [mlp_batch()]) == {}
