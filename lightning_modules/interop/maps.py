"""Which Hugging Face ``transformers`` model a :class:`ModelConfig` is (:func:`family`: ``bert``,
``albert`` or ``mobilebert``, and what is not expressible), and which tensor is which: a list of
:data:`Pair` (one HF parameter, ours, and the rows of ours it is: our fused ``qkv`` is ``[Q | K | V]``),
for ``*ForPreTraining`` (:func:`pairs`) and ``*ForSequenceClassification`` (:func:`classifier_pairs`),
copied by :func:`copy_pairs` (docs/guides/interop.md, "Conversion")."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ValidationError

from ablate.lightning_modules.config.errors import ConfigError, require
from ablate.lightning_modules.config.model import MOBILEBERT_EPS, LayerSpec, ModelConfig
from ablate.lightning_modules.model import names

if TYPE_CHECKING:  # transformers is imported when used (the hf extra)
    from transformers import PretrainedConfig, PreTrainedModel

# (HF parameter name, our parameter name, rows (start, stop) of ours or None for all of it)
Pair = tuple[str, str, tuple[int, int] | None]

CLASSES = {"bert": "BertForPreTraining", "albert": "AlbertForPreTraining", "mobilebert": "MobileBertForPreTraining"}
CLASSIFIER_CLASSES = {
    "bert": "BertForSequenceClassification",
    "albert": "AlbertForSequenceClassification",
    "mobilebert": "MobileBertForSequenceClassification",
}
# HF's pooler (dense + tanh on [CLS]; MobileBERT's only with classifier_activation) and NSP/SOP classifier
POOLERS = {"bert": "bert.pooler.dense", "albert": "albert.pooler", "mobilebert": "mobilebert.pooler.dense"}
_SENTENCE = {
    "bert": "cls.seq_relationship",
    "albert": "sop_classifier.classifier",
    "mobilebert": "cls.seq_relationship",
}
HEAD = "head"  # Classifier.head: pooler + classifier
# HF MobileBERT builds its embedding LayerNorm and each block's last FFN LayerNorm without eps (torch's 1e-5)
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate")


def family(cfg: ModelConfig) -> str:
    """``bert``, ``albert`` or ``mobilebert``; ConfigError saying why when none fits."""
    why: list[str] = []
    if cfg.position != "learned":
        why.append("model.position: HF models always add learned positions")
    if cfg.token_types == 0:
        why.append("model.token_types: HF models always have a token-type embedding")
    if not cfg.embed_norm:
        why.append("model.embed_norm: HF models always norm the embedding sum")
    uniform = LayerSpec(num_heads=cfg.num_heads, qk_dim=cfg.head_dim, v_dim=cfg.head_dim, ffn_dim=cfg.ffn_dim)
    if cfg.layers is not None and any(spec != uniform for spec in cfg.layers):
        why.append("model.layers: per-layer dimensions (HF layers are uniform, qk_dim = v_dim = width / heads)")
    if cfg.embedding == "trigram":
        name = "mobilebert"
        if cfg.sharing != "none":
            why.append(f"model.sharing: {cfg.sharing!r} (MobileBERT shares nothing)")
        if cfg.intra_dim is not None and cfg.attention_input == "hidden" and cfg.intra_dim != cfg.hidden_dim:
            why.append(
                "model.attention_input: 'hidden' needs intra_dim == hidden_dim (HF reads Q, K through an "
                "intra-wide Linear)"
            )
        if cfg.norm == "layer_norm" and cfg.norm_eps != MOBILEBERT_EPS:
            why.append(
                f"model.norm_eps: MobileBERT with LayerNorm needs norm_eps={MOBILEBERT_EPS} (HF hard-codes "
                "it for two of its norms)"
            )
    else:
        name = "bert" if cfg.sharing == "none" and cfg.embed_dim == cfg.hidden_dim else "albert"
        if cfg.intra_dim is not None:
            why.append("model.intra_dim: a bottleneck needs the trigram embedding (MobileBERT)")
        if cfg.num_ffn != 1:
            why.append("model.num_ffn: stacked FFNs need the trigram embedding (MobileBERT)")
        if cfg.norm != "layer_norm":
            why.append("model.norm: 'no_norm' needs the trigram embedding (MobileBERT)")
        if cfg.sharing in ("attn", "ffn"):
            why.append(f"model.sharing: {cfg.sharing!r} has no transformers equivalent (ALBERT shares all or none)")
    if why:
        raise ConfigError(f"not expressible as a transformers {CLASSES[name]}: " + "; ".join(why))
    return name


def hf_class(name: str, classes: dict[str, str] = CLASSES) -> type[PreTrainedModel]:
    """The transformers class of family ``name`` (``CLASSES`` or ``CLASSIFIER_CLASSES``)."""
    transformers = require("transformers", "hf")

    cls: type[PreTrainedModel] = getattr(transformers, classes[name])
    return cls


def hf_config(cfg: ModelConfig, name: str, **extra: object) -> PretrainedConfig:
    """The transformers config of family ``name`` describing ``cfg`` (``extra``: further fields,
    e.g. a classifier's ``id2label`` and its dropout)."""
    transformers = require("transformers", "hf")

    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_dim,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.ffn_dim,
        hidden_act=cfg.activation,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
        max_position_embeddings=cfg.max_position,
        type_vocab_size=cfg.token_types,
        initializer_range=cfg.init_std,
        layer_norm_eps=cfg.norm_eps,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    config: PretrainedConfig
    if name == "bert":
        config = transformers.BertConfig(**common, **extra)
        return config
    if name == "albert":
        config = transformers.AlbertConfig(
            **common,
            embedding_size=cfg.embed_dim,
            inner_group_num=1,
            num_hidden_groups=1 if cfg.sharing == "all" else cfg.num_layers,
            **{"classifier_dropout_prob": 0.0, **extra},
        )
        return config
    neck = cfg.intra_dim is not None
    config = transformers.MobileBertConfig(
        **common,
        **extra,
        embedding_size=cfg.embed_dim,
        trigram_input=True,
        use_bottleneck=neck,
        intra_bottleneck_size=cfg.block_dim,
        use_bottleneck_attention=neck and cfg.attention_input == "bottleneck",
        key_query_shared_bottleneck=neck and cfg.attention_input == "shared_qk",
        num_feedforward_networks=cfg.num_ffn,
        normalization_type=cfg.norm,
        classifier_activation=True,
    )
    return config


def _activation(act: object) -> str:
    if isinstance(act, str) and act in ("gelu", "relu"):
        return act
    if act in _TANH_GELU:
        warnings.warn(
            f"hidden_act {act!r} (tanh-approximate GELU) is read as exact 'gelu': outputs differ slightly", stacklevel=3
        )
        return "gelu"
    raise ConfigError(f"hidden_act: {act!r} is not supported (gelu or relu)")


def model_config(hf: PretrainedConfig) -> tuple[str, ModelConfig]:
    """Family and :class:`ModelConfig` of a transformers config; ConfigError if not supported."""
    name = getattr(hf, "model_type", None)
    if name not in CLASSES:
        raise ConfigError(f"model_type: {name!r} is not supported (bert, albert, mobilebert)")
    fields: dict[str, Any] = dict(
        vocab_size=hf.vocab_size,
        embed_dim=hf.hidden_size,
        hidden_dim=hf.hidden_size,
        num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads,
        ffn_dim=hf.intermediate_size,
        activation=_activation(hf.hidden_act),
        max_position=hf.max_position_embeddings,
        token_types=hf.type_vocab_size,
        dropout=hf.hidden_dropout_prob,
        norm_eps=hf.layer_norm_eps,
        init_std=hf.initializer_range,
    )
    family_fields = {"bert": _bert_fields, "albert": _albert_fields, "mobilebert": _mobilebert_fields}[name]
    fields.update(family_fields(hf))
    try:
        return name, ModelConfig(**fields)
    except ValidationError as exc:
        raise ConfigError(f"{name} config: {exc.errors()[0]['msg']}") from None


def _bert_fields(hf: PretrainedConfig) -> dict[str, Any]:
    """None beyond the common ones; ConfigError for a decoder or relative positions."""
    if hf.is_decoder or hf.add_cross_attention:
        raise ConfigError("is_decoder: decoder BERT is not supported")
    if getattr(hf, "position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"position_embedding_type: {hf.position_embedding_type!r} is not supported")
    return {}


def _albert_fields(hf: PretrainedConfig) -> dict[str, Any]:
    """The embedding width and the sharing (all or none); ConfigError for other layer groups."""
    if hf.inner_group_num != 1 or hf.num_hidden_groups not in (1, hf.num_hidden_layers):
        raise ConfigError(
            f"num_hidden_groups: {hf.num_hidden_groups} groups of {hf.inner_group_num} layers; "
            "only all shared (1 group of 1) or none shared (L groups of 1) are supported"
        )
    return dict(embed_dim=hf.embedding_size, sharing="all" if hf.num_hidden_groups == 1 else "none")


def _mobilebert_fields(hf: PretrainedConfig) -> dict[str, Any]:
    """The trigram embedding, FFN stack, norm and bottleneck; ConfigError for what ours cannot be."""
    if not hf.trigram_input:
        raise ConfigError("trigram_input: MobileBERT without the trigram embedding is not supported")
    if not hf.classifier_activation:
        raise ConfigError("classifier_activation: a pooler without dense + tanh is not supported")
    if hf.normalization_type == "layer_norm" and hf.layer_norm_eps != MOBILEBERT_EPS:
        raise ConfigError(
            f"layer_norm_eps: MobileBERT with LayerNorm is supported only with eps={MOBILEBERT_EPS} "
            "(HF hard-codes it for two of its norms)"
        )
    fields: dict[str, Any] = dict(
        mlm_head="mobilebert",
        embed_dim=hf.embedding_size,
        embedding="trigram",
        num_ffn=hf.num_feedforward_networks,
        norm=hf.normalization_type,
    )
    if hf.use_bottleneck:
        attn = (
            "bottleneck" if hf.use_bottleneck_attention else "shared_qk" if hf.key_query_shared_bottleneck else "hidden"
        )
        fields.update(intra_dim=hf.intra_bottleneck_size, attention_input=attn)
        if attn == "hidden" and hf.intra_bottleneck_size != hf.hidden_size:
            raise ConfigError("intra_bottleneck_size: attention on the hidden input needs intra == hidden_size")
    return fields


def _both(hf: str, ours: str, rows: tuple[int, int] | None = None) -> list[Pair]:
    """weight and bias of one Linear / norm."""
    return [(f"{hf}.weight", f"{ours}.weight", rows), (f"{hf}.bias", f"{ours}.bias", rows)]


# HF's modules under one layer -> ours: the FFN's under our FFN sub-layer, MobileBERT's bottleneck's under ours
_BERT_FFN = {"intermediate.dense": "inner.up", "output.dense": "inner.down", "output.LayerNorm": "norm"}
_ALBERT_FFN = {"ffn": "inner.up", "ffn_output": "inner.down", "full_layer_layer_norm": "norm"}
_BOTTLENECK = {
    "bottleneck.input.dense": "enter.linear",
    "bottleneck.input.LayerNorm": "enter.norm",
    "output.bottleneck.dense": "exit",
    "output.bottleneck.LayerNorm": "exit_norm",
}
_SHARED_QK = {"bottleneck.attention.dense": "shared_qk.linear", "bottleneck.attention.LayerNorm": "shared_qk.norm"}
# HF's attention modules under one layer: the Q/K/V parent, the output dense, the norm
_BERT_ATTENTION = ("attention.self", "attention.output.dense", "attention.output.LayerNorm")
_ALBERT_ATTENTION = ("attention", "attention.dense", "attention.LayerNorm")


def encoder_pairs(name: str, cfg: ModelConfig) -> list[Pair]:
    """The HF <-> ours pairs of the encoder (embeddings and layers; HF's ``<family>.*`` but the pooler)."""
    layers = {"bert": _bert_layers, "albert": _albert_layers, "mobilebert": _mobilebert_layers}[name]
    return [
        (f"{name}.embeddings.word_embeddings.weight", names.embeddings("word.weight"), None),
        (f"{name}.embeddings.position_embeddings.weight", names.embeddings("position.weight"), None),
        (f"{name}.embeddings.token_type_embeddings.weight", names.embeddings("token_type.weight"), None),
        *_both(f"{name}.embeddings.LayerNorm", names.embeddings("norm")),
        *layers(cfg),
    ]


def _attention_pairs(hf: str, i: int, cfg: ModelConfig, parts: tuple[str, str, str], separate_v: bool) -> list[Pair]:
    """HF layer ``hf``'s attention (``parts``: Q/K/V parent, output dense, norm) -> our attention ``i``:
    query/key/value -> rows of our fused qkv (or [Q|K] plus a separate v)."""
    qkv, dense, norm = (f"{hf}.{part}" for part in parts)
    ours, width = names.attention(i, "inner"), cfg.num_heads * cfg.head_dim
    out = _both(f"{qkv}.query", f"{ours}.qkv", (0, width)) + _both(f"{qkv}.key", f"{ours}.qkv", (width, 2 * width))
    if separate_v:
        out += _both(f"{qkv}.value", f"{ours}.v")
    else:
        out += _both(f"{qkv}.value", f"{ours}.qkv", (2 * width, 3 * width))
    return out + _both(dense, names.attention(i, "inner.out")) + _both(norm, names.attention(i, "norm"))


def _renamed(hf: str, ours: str, modules: Mapping[str, str]) -> list[Pair]:
    """weight and bias of each HF module ``hf.<theirs>`` -> ``ours.<ours>`` (``modules``: theirs -> ours)."""
    return [pair for theirs, mine in modules.items() for pair in _both(f"{hf}.{theirs}", f"{ours}.{mine}")]


def _bert_layers(cfg: ModelConfig) -> list[Pair]:
    out: list[Pair] = []
    for i in range(cfg.num_layers):
        hf = f"bert.encoder.layer.{i}"
        out += _attention_pairs(hf, i, cfg, _BERT_ATTENTION, False) + _renamed(hf, names.ffn(i, 0), _BERT_FFN)
    return out


def _albert_layers(cfg: ModelConfig) -> list[Pair]:
    """The embedding projection (E != H) and one layer per group (one group when all are shared)."""
    out: list[Pair] = []
    if cfg.embed_dim != cfg.hidden_dim:
        out += _both("albert.encoder.embedding_hidden_mapping_in", names.embeddings("projection"))
    for g in range(1 if cfg.sharing == "all" else cfg.num_layers):
        hf = f"albert.encoder.albert_layer_groups.{g}.albert_layers.0"
        out += _attention_pairs(hf, g, cfg, _ALBERT_ATTENTION, False) + _renamed(hf, names.ffn(g, 0), _ALBERT_FFN)
    return out


def _mobilebert_layers(cfg: ModelConfig) -> list[Pair]:
    """The trigram embedding's Linear, then per layer its attention, FFN stack and bottleneck."""
    out = _both("mobilebert.embeddings.embedding_transformation", names.embeddings("trigram.linear"))
    shared_qk = cfg.intra_dim is not None and cfg.attention_input == "shared_qk"
    last = cfg.num_ffn - 1
    for i in range(cfg.num_layers):
        hf = f"mobilebert.encoder.layer.{i}"
        out += _attention_pairs(hf, i, cfg, _BERT_ATTENTION, shared_qk)
        for j in range(last):  # HF's ffn.<j> are the stack but its last, which is the layer's own
            out += _renamed(f"{hf}.ffn.{j}", names.ffn(i, j), _BERT_FFN)
        out += _renamed(hf, names.ffn(i, last), _BERT_FFN)
        if cfg.intra_dim is not None:
            out += _renamed(hf, names.bottleneck(i), (_BOTTLENECK | _SHARED_QK) if shared_qk else _BOTTLENECK)
    return out


def _mlm_pairs(name: str) -> list[Pair]:
    if name == "bert":
        return [
            *_both("cls.predictions.transform.dense", names.mlm_head("transform")),
            *_both("cls.predictions.transform.LayerNorm", names.mlm_head("norm")),
            ("cls.predictions.bias", names.mlm_head("bias"), None),
        ]
    if name == "albert":
        return [
            *_both("predictions.dense", names.mlm_head("transform")),
            *_both("predictions.LayerNorm", names.mlm_head("norm")),
            ("predictions.bias", names.mlm_head("bias"), None),
        ]
    return [("cls.predictions.bias", names.mlm_head("bias"), None)]  # the transform is mapped by hand


def pairs(name: str, cfg: ModelConfig, sentence: bool) -> list[Pair]:
    """Every HF ``*ForPreTraining`` <-> ours parameter pair of family ``name`` (without MobileBERT's MLM transform)."""
    out = encoder_pairs(name, cfg) + _mlm_pairs(name)
    if sentence:
        out += [
            *_both(POOLERS[name], names.sentence_head("pooler")),
            *_both(_SENTENCE[name], names.sentence_head("classifier")),
        ]
    return out


def classifier_pairs(name: str, cfg: ModelConfig) -> list[Pair]:
    """Every HF ``*ForSequenceClassification`` <-> :class:`Classifier` parameter pair of family ``name``
    (its exits, if any, have no HF counterpart)."""
    return [
        *encoder_pairs(name, cfg),
        *_both(POOLERS[name], f"{HEAD}.pooler"),
        *_both("classifier", f"{HEAD}.classifier"),
    ]


@torch.no_grad()
def copy_pairs(
    src: Mapping[str, torch.Tensor], dst: Mapping[str, torch.Tensor], mapping: list[Pair], to_hf: bool
) -> set[str]:
    """Copy every pair from ``src`` into ``dst`` (in place); the names of ``dst`` written."""
    written = set()
    for hf, ours, rows in mapping:
        s, d = (ours, hf) if to_hf else (hf, ours)
        value, target = src[s], dst[d]
        if rows is not None:
            value, target = (value[rows[0] : rows[1]], target) if to_hf else (value, target[rows[0] : rows[1]])
        if value.shape != target.shape:
            raise RuntimeError(f"interop map: {s} {tuple(value.shape)} does not fit {d} {tuple(target.shape)}")
        target.copy_(value)
        written.add(d)
    return written


def check_covered(kind: str, names: set[str], written: set[str]) -> None:
    """RuntimeError when a parameter of ``names`` was not mapped (a gap in the map, never the user's)."""
    if names - written:
        raise RuntimeError(f"interop map misses {kind} parameters: {sorted(names - written)[:6]}")


_MAPPING_IN = "albert.encoder.embedding_hidden_mapping_in"


@torch.no_grad()
def albert_identity_in(hf: PreTrainedModel, cfg: ModelConfig) -> set[str]:
    """With E == H ours has no projection: HF ALBERT's ``embedding_hidden_mapping_in`` becomes the identity;
    the names written (none otherwise)."""
    if cfg.embed_dim != cfg.hidden_dim:
        return set()
    tree: Any = hf  # transformers' submodules, by their attribute names
    mapping_in = tree.albert.encoder.embedding_hidden_mapping_in
    mapping_in.weight.copy_(torch.eye(cfg.hidden_dim))
    mapping_in.bias.zero_()
    return {f"{_MAPPING_IN}.weight", f"{_MAPPING_IN}.bias"}


def check_albert_identity_in(hf: PreTrainedModel, cfg: ModelConfig) -> None:
    """ConfigError unless HF ALBERT's ``embedding_hidden_mapping_in`` is the identity where ours has none (E == H)."""
    if cfg.embed_dim != cfg.hidden_dim:
        return
    tree: Any = hf  # transformers' submodules, by their attribute names
    m = tree.albert.encoder.embedding_hidden_mapping_in
    eye = torch.eye(cfg.hidden_dim, dtype=m.weight.dtype, device=m.weight.device)
    if not (torch.equal(m.weight, eye) and not m.bias.any()):
        raise ConfigError(
            "embedding_hidden_mapping_in: with embedding_size == hidden_size ours has no projection, so it must be "
            "the identity"
        )
