"""schuBERT's gates: learned multipliers alpha (initialised at 1) on a trained encoder's weights (:class:`Gates`,
:func:`attach`, :func:`detach`), placed so that the gated model with some gates at exactly zero computes what
:func:`ablate.lightning_modules.methods.pruning.surgery.shrink` computes after deleting those units. Which tensor
carries which gate, and the masked LayerNorm statistics: docs/guides/pruning.md ("Gates, counts and surgery")."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.utils.hooks import RemovableHandle

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.model import LayerSpec, ModelConfig
from ablate.lightning_modules.methods.pruning.keep import DIMS, LAYER_DIMS, Keep
from ablate.lightning_modules.model import names
from ablate.lightning_modules.model.components.attention import MultiHeadAttention
from ablate.lightning_modules.model.encoder import Residual
from ablate.lightning_modules.model.heads import PretrainingModel

# per-layer dimension -> its size in a layer
LAYER_SIZE: dict[str, Callable[[LayerSpec], int]] = {
    "heads": lambda s: s.num_heads,
    "qk": lambda s: s.qk_dim,
    "v": lambda s: s.v_dim,
    "ffn": lambda s: s.ffn_dim,
}
# model field -> (the value schuBERT pruning needs, why)
SUPPORTED: dict[str, tuple[object, str]] = {
    "sharing": ("none", "schuBERT pruning needs per-layer modules (sharing: none)"),
    "intra_dim": (None, "schuBERT pruning needs an encoder without bottlenecks"),
    "embedding": ("plain", "schuBERT pruning needs a plain embedding, not a trigram one"),
    "mlm_head": ("factorized", "schuBERT pruning needs the factorized MLM head"),
}


def check_supported(cfg: ModelConfig) -> None:
    """Raise ConfigError naming the first model field schuBERT pruning cannot handle."""
    for name, (needed, why) in SUPPORTED.items():
        if getattr(cfg, name) != needed:
            raise ConfigError(f"model.{name}: {why}, got {getattr(cfg, name)!r}")


class Gates(nn.Module):
    """The gates of the chosen dimensions, all ones at first.

    Args:
        cfg: the model to gate (must pass :func:`check_supported`).
        dims: the gated dimensions, a subset of ``DIMS`` (e.g. ``VARIANTS["schubert-f"]``).

    Attributes:
        h: Parameter (H,) when ``h`` is gated.
        heads, qk, v, ffn: ParameterList of one (size_i,) vector per layer, when gated.
    """

    def __init__(self, cfg: ModelConfig, dims: Iterable[str]) -> None:
        super().__init__()
        check_supported(cfg)
        dims = tuple(dims)
        unknown = sorted(set(dims) - set(DIMS))
        if unknown:
            raise ConfigError(f"gates: unknown dimensions {unknown}, expected some of {list(DIMS)}")
        self.cfg = cfg
        self.dims = tuple(d for d in DIMS if d in dims)
        if "h" in self.dims:
            self.h = nn.Parameter(torch.ones(cfg.hidden_dim))
        for dim in LAYER_DIMS:
            if dim in self.dims:
                setattr(self, dim, nn.ParameterList(torch.ones(LAYER_SIZE[dim](s)) for s in cfg.layer_specs()))

    def vectors(self) -> dict[str, list[torch.Tensor]]:
        """Gated dimension -> its vectors (one for ``h``, one per layer for the others)."""
        return {d: [self.h] if d == "h" else list(getattr(self, d)) for d in self.dims}

    def layer(self, dim: str, i: int) -> torch.Tensor | None:
        """Layer i's vector of a per-layer dimension, or None when it has no gates."""
        return getattr(self, dim)[i] if dim in self.dims else None

    def l1(self, dim: str) -> torch.Tensor:
        """Sum of |alpha| of one dimension over the model (the sparsity penalty)."""
        return torch.stack([v.abs().sum() for v in self.vectors()[dim]]).sum()

    @torch.no_grad()
    def zero_except(self, keep: Keep) -> None:
        """Set to zero every gate whose unit is not in ``keep`` (e.g. after thresholding)."""
        for dim, vectors in self.vectors().items():
            kept = (keep.h,) if dim == "h" else getattr(keep, dim)
            for vector, idx in zip(vectors, kept, strict=False):
                mask = torch.zeros_like(vector, dtype=torch.bool)
                mask[idx.to(vector.device)] = True
                vector.masked_fill_(~mask, 0.0)

    def _ones(self, n: int) -> torch.Tensor:
        ref = next(self.parameters())
        return torch.ones(n, device=ref.device, dtype=ref.dtype)

    def ffn_rows(self, i: int) -> torch.Tensor:
        """Layer i's multiplier of the up-projection rows of each feed-forward sub-layer: its ffn gate, (f,)."""
        gate = self.layer("ffn", i)
        if gate is None:
            raise ValueError("gates: ffn is not gated")
        return gate

    def qkv_rows(self, i: int) -> torch.Tensor:
        """Layer i's multiplier of the fused Q|K|V rows: ``[tile(q_gate) | 1 | a_h * v_d]``, (A*(2k+v),)."""
        s = self.cfg.layer_specs()[i]
        qk, heads, v = (self.layer(d, i) for d in ("qk", "heads", "v"))
        q = (qk if qk is not None else self._ones(s.qk_dim)).repeat(s.num_heads)  # (A*k,) head-major
        a = heads if heads is not None else self._ones(s.num_heads)  # (A,)
        v = v if v is not None else self._ones(s.v_dim)  # (v,)
        return torch.cat([q, self._ones(s.num_heads * s.qk_dim), (a[:, None] * v[None, :]).reshape(-1)])


@dataclass(frozen=True)
class Site:
    """One gated tensor: ``model.<path>.<name>`` is multiplied by ``gate()`` along ``axis``."""

    path: str
    name: str
    axis: int
    gate: Callable[[], torch.Tensor]

    @property
    def key(self) -> str:
        """The tensor's state-dict key."""
        return f"{self.path}.{self.name}"


def sites(model: PretrainingModel, gates: Gates) -> tuple[list[Site], list[str]]:
    """Where the gates go: the gated tensors, and the LayerNorms needing masked statistics."""
    cfg, tied = gates.cfg, gates.cfg.embed_dim == gates.cfg.hidden_dim
    out: list[Site] = []

    def add(
        path: str, gate: Callable[[], torch.Tensor], names: tuple[str, ...] = ("weight", "bias"), axis: int = 0
    ) -> None:
        out.extend(Site(path, name, axis, gate) for name in names)

    def of_layer(rows: Callable[[int], torch.Tensor], i: int) -> Callable[[], torch.Tensor]:
        return lambda: rows(i)  # i bound now, the gate read at each call

    norms: list[str] = []  # h writers that are norms over H
    for i in range(cfg.num_layers):
        if {"heads", "qk", "v"} & set(gates.dims):
            add(names.attention(i, "inner.qkv"), of_layer(gates.qkv_rows, i))
        norms.append(names.attention(i, "norm"))
        for j in range(cfg.num_ffn):
            if "ffn" in gates.dims:
                add(names.ffn(i, j, "inner.up"), of_layer(gates.ffn_rows, i))
            norms.append(names.ffn(i, j, "norm"))
    if "h" not in gates.dims:
        return out, []
    emb = model.encoder.embeddings
    if not tied:
        add(names.embeddings("projection"), lambda: gates.h)
    elif cfg.embed_norm:
        norms.append(names.embeddings("norm"))
    else:
        for name in names.TOKEN_EMBEDDINGS:
            if getattr(emb, name) is not None:
                add(names.embeddings(name), lambda: gates.h, ("weight",), axis=1)
    if tied:
        norms.append(names.mlm_head("norm"))
    if model.sentence_head is not None:
        add(names.sentence_head("pooler"), lambda: gates.h)
    for path in norms:
        add(path, lambda: gates.h)
    layer_norms = [p for p in norms if isinstance(model.get_submodule(p), nn.LayerNorm)]
    return out, layer_norms


class _Scale(nn.Module):
    """Parametrization ``w * gate()`` along one axis; the gates stay out of the model's parameters."""

    def __init__(self, gate: Callable[[], torch.Tensor], axis: int) -> None:
        super().__init__()
        self.gate, self.axis = gate, axis

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        shape = [1] * w.dim()
        shape[self.axis] = -1
        return w * self.gate().view(shape).to(w.dtype)


def masked_layer_norm(
    x: torch.Tensor, keep: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm of x (..., H) with statistics over the dims where ``keep`` (H,) is True only.

    Equals ``nn.LayerNorm`` over ``x[..., keep]`` at the kept dims; the others come out as
    ``bias`` there (zero when the weight and bias carry the zero gates)."""
    m = keep.to(torch.float32)  # (H,)
    xf = x.float()
    n = m.sum()
    mean = (xf * m).sum(-1, keepdim=True) / n  # (..., 1)
    xc = (xf - mean) * m  # (..., H), zero at removed dims
    var = (xc * xc).sum(-1, keepdim=True) / n  # (..., 1)
    return (xc * torch.rsqrt(var + eps) * weight.float() + bias.float()).to(x.dtype)


_ATTACHED: weakref.WeakKeyDictionary[nn.Module, list[tuple[nn.Module, str | RemovableHandle]]] = (
    weakref.WeakKeyDictionary()
)


def attached(model: nn.Module) -> bool:
    """Whether :func:`attach` has gated ``model`` (and :func:`detach` has not undone it)."""
    return model in _ATTACHED


def attach(model: PretrainingModel, gates: Gates) -> None:
    """Make ``model``'s normal forward use gated weights (see the module docstring).

    The gates are not registered in the model: optimise ``gates.parameters()`` next to the
    model's. While attached, ``model.state_dict()`` holds ``parametrizations.*.original``
    keys; :func:`detach` before saving or :func:`~ablate.lightning_modules.methods.pruning.surgery.shrink`.

    Args:
        model: a PretrainingModel built from ``gates.cfg`` (same device as the gates).
        gates: the gates.
    """
    if attached(model):
        raise ValueError("attach: the model already has gates; detach them first")
    _check_model(model, gates.cfg)
    done: list[tuple[nn.Module, str | RemovableHandle]] = []
    site_list, layer_norms = sites(model, gates)
    for site in site_list:
        module = model.get_submodule(site.path)
        parametrize.register_parametrization(module, site.name, _Scale(site.gate, site.axis))
        done.append((module, site.name))

    def hook(module: nn.LayerNorm, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        x = args[0].to(output.dtype)  # autocast runs LayerNorm in float32
        return masked_layer_norm(x, gates.h != 0, module.weight, module.bias, module.eps)  # replaces the output

    for path in layer_norms:
        module = model.get_submodule(path)
        done.append((module, module.register_forward_hook(hook)))
    _ATTACHED[model] = done


def detach(model: nn.Module) -> None:
    """Undo :func:`attach`: the original Parameter objects and forward are back."""
    for module, item in reversed(_ATTACHED.pop(model, [])):
        if isinstance(item, str):
            parametrize.remove_parametrizations(module, item, leave_parametrized=False)
        else:
            item.remove()


def _attention(sublayer: nn.Module) -> MultiHeadAttention:
    """The attention inside one of the encoder's attention sub-layers."""
    if not isinstance(sublayer, Residual) or not isinstance(sublayer.inner, MultiHeadAttention):
        raise TypeError(f"attach: expected a Residual around MultiHeadAttention, got {type(sublayer).__name__}")
    return sublayer.inner


def _check_model(model: PretrainingModel, cfg: ModelConfig) -> None:
    """The model has the per-layer, fused-QKV shape of ``cfg``."""
    attns = [_attention(a) for a in model.encoder.attentions]
    specs = cfg.layer_specs()
    shapes = [(a.num_heads, a.qk_dim, a.v_dim, a.v is None) for a in attns]
    if shapes != [(s.num_heads, s.qk_dim, s.v_dim, True) for s in specs]:
        raise ValueError("attach: the model does not match the gates' config (per-layer fused attention)")
