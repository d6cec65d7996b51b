"""Surgery: remove the rows and columns of pruned units for real, giving a smaller model (:func:`shrink`): a new
model from ``keep.config(cfg)`` with the kept slices of every tensor copied and the surviving gate values folded
in (and sqrt(k'/k) into the Q rows of a layer whose query/key width drops), so that it computes what the gated
model computes; docs/guides/pruning.md ("Gates, counts and surgery")."""

from __future__ import annotations

import math
from typing import Literal

import torch

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ObjectiveConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.methods.pruning.gates import Gates, attached, check_supported, sites
from ablate.lightning_modules.methods.pruning.keep import LAYER_DIMS, Keep
from ablate.lightning_modules.model import names
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model

Index = tuple[torch.Tensor | None, ...]  # per axis of a tensor, the indices kept (None = all)


def keep_from_gates(gates: Gates, cfg: ModelConfig) -> Keep:
    """The units whose gate is nonzero (every unit of an ungated dimension).

    A layer whose gates of one dimension are all zero keeps its first unit: the architecture
    has no zero-width sub-layers, and the unit's zero gate, folded in by :func:`shrink`,
    keeps it inert (a head or FFN row that outputs zero, a Q dim that adds nothing).

    Raises:
        ConfigError: every ``h`` gate is zero.
    """
    if gates.cfg.layer_specs() != cfg.layer_specs() or gates.cfg.hidden_dim != cfg.hidden_dim:
        raise ValueError("keep_from_gates: the gates were built for another model config")
    everything = Keep.everything(cfg)
    h = everything.h
    per_layer: dict[str, tuple[torch.Tensor, ...]] = {dim: getattr(everything, dim) for dim in LAYER_DIMS}
    for dim, vectors in gates.vectors().items():
        kept = [torch.nonzero(v.detach() != 0).flatten().cpu() for v in vectors]  # sorted
        if dim == "h":
            if not len(kept[0]):
                raise ConfigError("gates.h: every h gate is zero, no hidden dimension would remain")
            h = kept[0]
        else:
            per_layer[dim] = tuple(k if len(k) else torch.zeros(1, dtype=torch.long) for k in kept)
    return Keep(h=h, **per_layer)


def _head_rows(heads: torch.Tensor, dims: torch.Tensor, width: int, offset: int = 0) -> torch.Tensor:
    """Flat head-major indices ``offset + h * width + d`` of the kept heads x kept dims, (A'*d',)."""
    return (offset + heads[:, None] * width + dims[None, :]).reshape(-1)


def slices(cfg: ModelConfig, keep: Keep) -> dict[str, Index]:
    """State-dict key -> the indices kept along each axis; keys not listed are copied whole.

    Fused QKV rows are laid out ``[Q: A*k | K: A*k | V: A*v]``, head-major inside each part;
    the output projection's columns are ``A*v`` head-major."""
    h = keep.h
    e = h if cfg.embed_dim == cfg.hidden_dim else None  # E dims are h dims when E = H
    plan: dict[str, Index] = {
        **{names.embeddings(f"{n}.weight"): (None, e) for n in names.TOKEN_EMBEDDINGS},
        names.embeddings("norm.weight"): (e,),
        names.embeddings("norm.bias"): (e,),
        names.embeddings("projection.weight"): (h, None),
        names.embeddings("projection.bias"): (h,),
        names.mlm_head("transform.weight"): (e, h),
        names.mlm_head("transform.bias"): (e,),
        names.mlm_head("norm.weight"): (e,),
        names.mlm_head("norm.bias"): (e,),
        names.sentence_head("pooler.weight"): (h, h),
        names.sentence_head("pooler.bias"): (h,),
        names.sentence_head("classifier.weight"): (None, h),
    }
    for i, spec in enumerate(cfg.layer_specs()):
        A, k, v = spec.num_heads, spec.qk_dim, spec.v_dim
        a, kq, kv, f = keep.heads[i], keep.qk[i], keep.v[i], keep.ffn[i]
        rows = torch.cat([_head_rows(a, kq, k), _head_rows(a, kq, k, A * k), _head_rows(a, kv, v, 2 * A * k)])
        p = names.attention(i) + "."
        plan |= {
            p + "inner.qkv.weight": (rows, h),
            p + "inner.qkv.bias": (rows,),
            p + "inner.out.weight": (h, _head_rows(a, kv, v)),
            p + "inner.out.bias": (h,),
            p + "norm.weight": (h,),
            p + "norm.bias": (h,),
        }
        for j in range(cfg.num_ffn):
            p = names.ffn(i, j) + "."
            plan |= {
                p + "inner.up.weight": (f, h),
                p + "inner.up.bias": (f,),
                p + "inner.down.weight": (h, f),
                p + "inner.down.bias": (h,),
                p + "norm.weight": (h,),
                p + "norm.bias": (h,),
            }
    return plan


def _select(t: torch.Tensor, index: Index) -> torch.Tensor:
    """t restricted to the kept indices of each axis."""
    for axis, idx in enumerate(index):
        if idx is not None:
            t = t.index_select(axis, idx.to(t.device))
    return t


def shrink(
    model: PretrainingModel,
    cfg: ModelConfig,
    keep: Keep,
    gates: Gates | None = None,
    objective: ObjectiveConfig | None = None,
) -> tuple[ModelConfig, PretrainingModel]:
    """A new, smaller model holding the kept units of ``model`` (which is left as it is).

    Args:
        model: the trained model, built from ``cfg``, without gates attached.
        cfg: its config (must pass :func:`~ablate.lightning_modules.methods.pruning.gates.check_supported`).
        keep: the units to keep, e.g. :func:`keep_from_gates`.
        gates: when given, their values are folded into the copied weights.
        objective: the objective to build the new model for; None = a sentence head exactly
            when ``model`` has one, with its sentence weight.

    Returns:
        The shrunk config and the new model on ``model``'s device, in its train/eval mode.

    Raises:
        ConfigError: the encoder is not supported, or E != H and ``keep`` keeps exactly E
            of the h dims (the shrunk config could not hold the E -> H projection).
    """
    check_supported(cfg)
    if attached(model):
        raise ValueError("shrink: the model has gates attached; detach them and pass the gates instead")
    if gates is not None and gates.cfg != cfg:
        raise ValueError("shrink: the gates were built for another model config")
    if len(keep.heads) != cfg.num_layers:
        raise ValueError(f"shrink: keep has {len(keep.heads)} layers, the model {cfg.num_layers}")
    if cfg.embed_dim != cfg.hidden_dim and len(keep.h) == cfg.embed_dim:
        raise ConfigError(
            f"model.embed_dim: keeping {len(keep.h)} h dims = E would drop the E -> H projection, "
            "which a model with E = H does not have; keep one h dim more or less"
        )
    if objective is None:
        sentence: Literal["sop", "none"] = "sop" if model.sentence_head is not None else "none"
        objective = ObjectiveConfig(sentence=sentence, sentence_weight=model.sentence_weight)
    new_cfg = keep.config(cfg)
    with torch.no_grad():
        state = {key: t.detach().clone() for key, t in model.state_dict().items()}  # the input stays untouched
        for site in sites(model, gates)[0] if gates is not None else []:
            t = state[site.key]
            shape = [1] * t.dim()
            shape[site.axis] = -1
            state[site.key] = t * site.gate().detach().view(shape).to(t)
        for key, index in slices(cfg, keep).items():
            if key in state:
                state[key] = _select(state[key], index)
        for i, (spec, new) in enumerate(zip(cfg.layer_specs(), new_cfg.layer_specs(), strict=False)):
            if new.qk_dim != spec.qk_dim:  # keep the gated model's 1/sqrt(k) score scale
                for name in ("weight", "bias"):
                    state[names.attention(i, f"inner.qkv.{name}")][: new.num_heads * new.qk_dim] *= math.sqrt(
                        new.qk_dim / spec.qk_dim
                    )
    with torch.device("meta"):
        shrunk = build_pretraining_model(new_cfg, objective)
    shrunk.load_state_dict(state, assign=True)
    return new_cfg, shrunk.train(model.training)


def first_layers(model: PretrainingModel, new_cfg: ModelConfig, objective: ObjectiveConfig) -> PretrainingModel:
    """The first ``new_cfg.num_layers`` layers of ``model`` (with its embeddings and heads)."""
    small = build_pretraining_model(new_cfg, objective)
    keep = {f"{kind}.{i}." for kind in (names.ATTENTIONS, names.FFN_STACKS) for i in range(new_cfg.num_layers)}
    state = {
        k: v
        for k, v in model.state_dict().items()
        if not k.startswith((names.ATTENTIONS + ".", names.FFN_STACKS + ".")) or any(k.startswith(p) for p in keep)
    }
    head = names.sentence_head() + "."
    if small.sentence_head is None:
        state = {k: v for k, v in state.items() if not k.startswith(head)}
    missing, _ = small.load_state_dict(state, strict=False)
    if any(not k.startswith(head) for k in missing):  # only a sentence head may start fresh
        raise ConfigError(f"prune.source: its weights do not fit {new_cfg.num_layers} layers ({missing[:3]})")
    return small
