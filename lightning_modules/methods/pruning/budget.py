"""Parameter budgets of schuBERT pruning: exact counts, unit costs, the sparsity weights beta, the greedy choice
of units to remove, and the baselines pruned to the same count, all by formula on plain integers (no model is
built). Scope and counting rules: docs/guides/pruning.md ("Gates, counts and surgery")."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.model import LayerSpec, ModelConfig
from ablate.lightning_modules.methods.pruning.keep import DIMS, LAYER_DIMS, Keep
from ablate.lightning_modules.model.components.attention import MultiHeadAttention
from ablate.lightning_modules.model.components.ffn import FeedForward
from ablate.lightning_modules.model.encoder import Encoder, Residual
from ablate.lightning_modules.model.heads import PretrainingModel

Dims = list[int]  # one layer's [heads, qk, v, ffn], in LAYER_DIMS order
_SLOT = {dim: i for i, dim in enumerate(LAYER_DIMS)}
# what the scope needs: field -> (the value it must have, why)
_SCOPE = {"sharing": ("none", "shared layers"), "intra_dim": (None, "bottlenecks"), "embedding": ("plain", "trigram")}


@dataclasses.dataclass(frozen=True)
class _Rule:
    """The parts of a config that a prunable shape does not change."""

    vocab_rows: int  # word + position + token-type rows, all at width E
    embed_norm: bool
    tied: bool  # E == H: the embedding shrinks with h
    embed_dim: int
    num_ffn: int

    @classmethod
    def of(cls, cfg: ModelConfig) -> _Rule:
        for name, (wanted, what) in _SCOPE.items():
            if getattr(cfg, name) != wanted:
                raise ConfigError(
                    f"model.{name}: schuBERT budgets cover plain encoders, not {what} ({getattr(cfg, name)!r})"
                )
        rows = cfg.vocab_size + (cfg.max_position if cfg.position == "learned" else 0) + cfg.token_types
        return cls(rows, cfg.embed_norm, cfg.embed_dim == cfg.hidden_dim, cfg.embed_dim, cfg.num_ffn)

    def embedding(self, H: int) -> int:
        """Word/position/token-type tables, the embedding norm and (E != H) the E -> H projection."""
        E = H if self.tied else self.embed_dim
        tables = self.vocab_rows * E + (2 * E if self.embed_norm else 0)
        return tables if self.tied else tables + (E + 1) * H

    def layer(self, H: int, dims: Dims) -> int:
        """One block: fused QKV and output projection, F feed-forward sub-layers, their norms."""
        a, k, v, f = dims
        attention = (H + 1) * a * (2 * k + v) + (a * v + 1) * H + 2 * H
        return attention + self.num_ffn * ((H + 1) * f + (f + 1) * H + 2 * H)

    def total(self, H: int, layers: list[Dims]) -> int:
        return self.embedding(H) + sum(self.layer(H, dims) for dims in layers)

    def cost(self, dim: str, layer: int, H: int, layers: list[Dims]) -> int:
        """Parameters removed by removing one unit of ``dim`` (of ``layer``) from this shape."""
        if dim == "h":
            return self.total(H, layers) - self.total(H - 1, layers)
        fewer = list(layers[layer])
        fewer[_SLOT[dim]] -= 1
        return self.layer(H, layers[layer]) - self.layer(H, fewer)


def _shape(cfg: ModelConfig) -> tuple[int, list[Dims]]:
    return cfg.hidden_dim, [[s.num_heads, s.qk_dim, s.v_dim, s.ffn_dim] for s in cfg.layer_specs()]


def _config(cfg: ModelConfig, H: int, layers: list[Dims]) -> ModelConfig:
    """``cfg`` at hidden size H (E too when E == H) with per-layer dimensions ``layers``."""
    specs = tuple(LayerSpec(num_heads=a, qk_dim=k, v_dim=v, ffn_dim=f) for a, k, v, f in layers)
    E = H if cfg.embed_dim == cfg.hidden_dim else cfg.embed_dim
    return dataclasses.replace(cfg, hidden_dim=H, embed_dim=E, layers=specs, num_layers=len(specs))


def backbone_params(cfg: ModelConfig) -> int:
    """Exact backbone parameters (embeddings + encoder) of ``cfg``, by formula.

    Equals ``accounting.param_report(...).backbone`` of the built model.
    """
    return _Rule.of(cfg).total(*_shape(cfg))


def unit_costs(cfg: ModelConfig) -> dict[str, list[int]]:
    """Parameters removed by removing one unit of each dimension at ``cfg``'s shape.

    Returns:
        ``'h'`` -> [one count: embedding columns (E == H) or projection rows (E != H), every
        layer's rows/columns and norms]; ``'heads'``, ``'qk'``, ``'v'``, ``'ffn'`` -> one count
        per layer (a head: its Q, K, V rows and biases and its output-projection columns).
    """
    rule, (H, layers) = _Rule.of(cfg), _shape(cfg)
    costs = {dim: [rule.cost(dim, i, H, layers) for i in range(len(layers))] for dim in LAYER_DIMS}
    return {"h": [rule.cost("h", 0, H, layers)], **costs}


def beta(cfg: ModelConfig) -> dict[str, float]:
    """schuBERT's sparsity weights: each dimension's unit cost over the cost of one head of layer 0.

    For BERT-base: heads 1.0, h 0.717, qk 0.0938, v 0.0937, ffn 0.0078 (the paper: 1.0, 0.73,
    0.093, 0.093, 0.0078). Per-layer dimensions use layer 0's value.
    """
    costs = unit_costs(cfg)
    return {dim: costs[dim][0] / costs["heads"][0] for dim in DIMS}


def _alive(keep: Keep) -> dict[str, list[list[int]]]:
    return {"h": [keep.h.tolist()], **{dim: [t.tolist() for t in getattr(keep, dim)] for dim in LAYER_DIMS}}


def choose(cfg: ModelConfig, gates: dict[str, list[torch.Tensor]], remove: int, keep: Keep | None = None) -> Keep:
    """One greedy round of schuBERT: remove the gated units of smallest |alpha| until at least
    ``remove`` parameters are gone.

    Each unit is costed exactly on the shrinking shape (removing a head makes the layer's qk
    and v units cheaper). A unit that is the last of its dimension (one head, qk, v, ffn unit
    per layer, one h unit) is skipped; the round ends when ``remove`` is reached or no unit
    is left to remove. So ``remove <= removed < remove + cost of the last unit removed``
    unless the model cannot shrink that far.

    Args:
        cfg: the current model's shape.
        gates: the gated dimensions only: ``'h'`` -> [tensor (H,)], per-layer dimensions ->
            one tensor per layer, indexed like the current model's units.
        remove: parameters to remove (beyond those ``keep`` already drops).
        keep: units still alive (default: all); only these are candidates.

    Returns:
        The surviving units (sorted indices, relative to the current model); ungated
        dimensions keep what ``keep`` keeps.
    """
    rule, start = _Rule.of(cfg), keep or Keep.everything(cfg)
    alive = _alive(start)
    unknown = set(gates) - set(DIMS)
    if unknown:
        raise ValueError(f"gates: unknown dimensions {sorted(unknown)}; known: {DIMS}")
    H, layers = len(alive["h"][0]), [[len(alive[d][i]) for d in LAYER_DIMS] for i in range(cfg.num_layers)]
    dead: dict[str, list[set[int]]] = {dim: [set() for _ in alive[dim]] for dim in DIMS}
    units: list[tuple[float, int, int, int]] = []  # (|alpha|, dimension, layer, unit)
    for d, dim in enumerate(DIMS):
        for layer, alpha in enumerate(gates.get(dim, [])):
            living, values = set(alive[dim][layer]), alpha.detach().abs().float().cpu().tolist()
            units += [(a, d, layer, j) for j, a in enumerate(values) if j in living]
    removed = 0
    for _, d, layer, j in sorted(units):
        if removed >= remove:
            break
        dim = DIMS[d]
        size = H if dim == "h" else layers[layer][_SLOT[dim]]
        if size <= 1:
            continue
        removed += rule.cost(dim, layer, H, layers)
        dead[dim][layer].add(j)
        if dim == "h":
            H -= 1
        else:
            layers[layer][_SLOT[dim]] -= 1
    kept = {
        dim: tuple(
            torch.tensor([j for j in alive[dim][i] if j not in dead[dim][i]], dtype=torch.long)
            for i in range(len(alive[dim]))
        )
        for dim in DIMS
    }
    return Keep(h=kept["h"][0], **{dim: kept[dim] for dim in LAYER_DIMS})


def _scaled(H: int, layers: list[Dims], s: float) -> tuple[int, list[Dims]]:
    """H and every layer's qk, v and ffn widths times ``s``, rounded half up, at least 1; heads kept."""

    def scale(n: int) -> int:
        return max(1, int(n * s + 0.5))

    return scale(H), [[a, scale(k), scale(v), scale(f)] for a, k, v, f in layers]


def uniform(cfg: ModelConfig, target: int) -> ModelConfig:
    """The baseline shrunk uniformly: H, E (when E == H) and every layer's qk, v and ffn widths
    times one factor s (heads kept), s found by bisection so the backbone count is the nearest
    reachable to ``target``. ``cfg`` itself when ``target`` is at least its count.
    """
    rule, (H, layers) = _Rule.of(cfg), _shape(cfg)
    lo, hi = 0.0, 1.0
    if target >= rule.total(H, layers):
        return cfg
    for _ in range(64):  # count(lo) <= target < count(hi), with lo and hi one step apart at the end
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rule.total(*_scaled(H, layers, mid)) <= target else (lo, mid)
    best = min((lo, hi), key=lambda s: abs(rule.total(*_scaled(H, layers, s)) - target))
    return _config(cfg, *_scaled(H, layers, best))


def fewer_layers(cfg: ModelConfig, target: int) -> ModelConfig:
    """The baseline with fewer layers: the first L' >= 1 layers of ``cfg``, L' with the backbone
    count nearest ``target``."""
    rule, (H, layers) = _Rule.of(cfg), _shape(cfg)
    n = min(range(1, len(layers) + 1), key=lambda m: abs(rule.total(H, layers[:m]) - target))
    return dataclasses.replace(cfg, num_layers=n, layers=None if cfg.layers is None else cfg.layers[:n])


def _sq(w: torch.Tensor, axis: int) -> torch.Tensor:
    """Sum of squares of ``w`` for each index along ``axis`` (the units on that axis)."""
    w = w.detach().float()
    return w.pow(2).sum(dim=[d for d in range(w.dim()) if d != axis]) if w.dim() > 1 else w.pow(2)


def _affine(norm: nn.Module) -> torch.Tensor | int:
    """Squared weight + bias of a norm per unit (0 for Identity)."""
    return sum((_sq(p, 0) for p in norm.parameters()), 0)


def _attention(encoder: Encoder, i: int) -> tuple[Residual, MultiHeadAttention]:
    """Layer i's attention sub-layer and the attention inside it."""
    residual = encoder.attentions[encoder.plan[i].attention]
    if not isinstance(residual, Residual) or not isinstance(residual.inner, MultiHeadAttention):
        raise TypeError(f"layer {i}: expected a Residual around MultiHeadAttention, got {type(residual).__name__}")
    return residual, residual.inner


def _ffns(encoder: Encoder, i: int) -> list[tuple[Residual, FeedForward]]:
    """Layer i's feed-forward sub-layers and the feed-forward inside each."""
    stack = encoder.ffn_stacks[encoder.plan[i].ffn]
    if not isinstance(stack, nn.ModuleList):
        raise TypeError(f"layer {i}: expected a ModuleList of feed-forward sub-layers, got {type(stack).__name__}")
    out = []
    for sub in stack:
        if not isinstance(sub, Residual) or not isinstance(sub.inner, FeedForward):
            raise TypeError(f"layer {i}: expected Residuals around FeedForward, got {type(sub).__name__}")
        out.append((sub, sub.inner))
    return out


def _layer_norms(encoder: Encoder, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Layer i's squared weights per hidden unit, and per head, qk, v and ffn unit (what removing
    the unit removes: a head's Q, K, V rows with biases and its output columns, and so on)."""
    residual, attn = _attention(encoder, i)
    A, k, v = attn.num_heads, attn.qk_dim, attn.v_dim
    rows = torch.cat([attn.qkv.weight, attn.qkv.bias[:, None]], 1).detach()  # (A(2k+v), H+1), head-major blocks
    q, key, val = torch.split(rows, [A * k, A * k, A * v])  # Tensor.split is untyped
    qk = torch.stack([q.reshape(A, k, -1), key.reshape(A, k, -1)])  # (2, A, k, H+1)
    val = val.reshape(A, v, -1)  # (A, v, H+1)
    out = attn.out.weight.detach().reshape(-1, A, v)  # (H, A, v)
    units = {"heads": _sq(qk, 1) + _sq(val, 0) + _sq(out, 1), "qk": _sq(qk, 2), "v": _sq(val, 1) + _sq(out, 2)}
    hidden = _sq(attn.qkv.weight, 1) + _sq(attn.out.weight, 0) + _sq(attn.out.bias, 0) + _affine(residual.norm)
    ffn: torch.Tensor | int = 0
    for sub, inner in _ffns(encoder, i):
        up, down = inner.up, inner.down
        ffn = ffn + _sq(torch.cat([up.weight, up.bias[:, None]], 1), 0) + _sq(down.weight, 1)
        hidden = hidden + _sq(up.weight, 1) + _sq(down.weight, 0) + _sq(down.bias, 0) + _affine(sub.norm)
    assert isinstance(ffn, torch.Tensor), "a layer has at least one feed-forward sub-layer (model.num_ffn >= 1)"
    units["ffn"] = ffn
    return hidden, units


def _embedding_norms(encoder: Encoder, tied: bool) -> torch.Tensor:
    """Squared embedding weights per hidden unit: table columns and norm (E == H) or projection rows."""
    emb = encoder.embeddings
    if not tied:
        assert emb.projection is not None, "E != H: the embedding projects E -> H"
        return _sq(torch.cat([emb.projection.weight, emb.projection.bias[:, None]], 1), 0)
    tables = [t.weight for t in (emb.word, emb.position, emb.token_type) if t is not None]
    norms = sum((_sq(w, 1) for w in tables), _affine(emb.norm))
    assert isinstance(norms, torch.Tensor), "there is always a word table"
    return norms


def _top(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Sorted indices of the n largest scores."""
    return torch.topk(scores, n).indices.sort().values


def magnitude_keep(model: PretrainingModel | Encoder, cfg: ModelConfig, new_cfg: ModelConfig) -> Keep:
    """The units of largest weight norm that slice a trained model of shape ``cfg`` to ``new_cfg``.

    Each unit is scored by the sum of squares of the parameters removing it would remove
    (an h unit: its embedding columns or projection row and every layer's rows, columns
    and norm entries touching it; a head: its Q, K, V rows, biases and output columns; a qk
    or v unit: that row in every head; an ffn unit: its up row, bias and down column).

    Args:
        model: the trained model (or its encoder), of shape ``cfg``.
        cfg: its shape.
        new_cfg: the target, e.g. from :func:`uniform`: the same L, no dimension wider than cfg's.

    Returns:
        The kept units, with ``keep.config(cfg)`` shaped like ``new_cfg``.
    """
    rule, (H, layers), (H2, layers2) = _Rule.of(cfg), _shape(cfg), _shape(new_cfg)
    if (
        len(layers2) != len(layers)
        or H2 > H
        or any(n > o for l2, l1 in zip(layers2, layers, strict=False) for n, o in zip(l2, l1, strict=False))
    ):
        raise ValueError(f"new_cfg: needs the same {len(layers)} layers and no dimension wider than cfg's")
    encoder = model.encoder if isinstance(model, PretrainingModel) else model
    with torch.no_grad():
        hidden = _embedding_norms(encoder, rule.tied)
        per: dict[str, list[torch.Tensor]] = {dim: [] for dim in LAYER_DIMS}
        for i, dims in enumerate(layers2):
            h_i, units = _layer_norms(encoder, i)
            hidden = hidden + h_i
            for dim in LAYER_DIMS:
                per[dim].append(_top(units[dim], dims[_SLOT[dim]]))
        return Keep(h=_top(hidden, H2), **{dim: tuple(per[dim]) for dim in LAYER_DIMS})
