"""The encoder: embeddings and a stack of post-norm transformer blocks, cross-layer sharing resolved in
one place (:func:`layer_plan`: the unique modules and which of them layer i runs), each layer run by
one stateless :class:`LayerBlock` that compiles once per layer shape (docs/development.md, "Layout")."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import torch
from torch import nn

from ablate.lightning_modules.config.model import SHARES, LayerSpec, ModelConfig
from ablate.lightning_modules.model.components.attention import attention
from ablate.lightning_modules.model.components.bottleneck import Bottleneck, Projection
from ablate.lightning_modules.model.components.embeddings import Embeddings, Trigram
from ablate.lightning_modules.model.components.ffn import feed_forward
from ablate.lightning_modules.model.components.norms import NORM2FN, dropout


class Step(NamedTuple):
    """Which unique modules layer i runs."""

    attention: int
    ffn: int
    bottleneck: int


def layer_plan(num_layers: int, sharing: str) -> list[Step]:
    """For each layer, the index of its attention, feed-forward stack and bottleneck.

    ``all`` shares every module (bottlenecks too); ``attn`` and ``ffn`` share one kind.
    """
    share_attn, share_ffn = SHARES[sharing]
    return [
        Step(0 if share_attn else i, 0 if share_ffn else i, 0 if share_attn and share_ffn else i)
        for i in range(num_layers)
    ]


@dataclass
class Trace:
    """What :meth:`Encoder.forward` records when given one (distillation reads it).

    Args:
        attention: layers whose attention scores to keep (None = all; empty = none).
        until: stop after this layer (None = run all layers).
    """

    attention: frozenset[int] | None = None
    until: int | None = None
    embedding: torch.Tensor | None = None  # (B, T, H)
    hidden: list[torch.Tensor] = field(default_factory=list)  # per layer run: (B, T, H)
    scores: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, A, T, T) pre-softmax

    def wants_attention(self, layer: int) -> bool:
        return self.attention is None or layer in self.attention

    def detach(self) -> None:
        """Cut what was recorded from the autograd graph (a teacher's trace read as fixed targets)."""
        self.embedding = None if self.embedding is None else self.embedding.detach()
        self.hidden = [h.detach() for h in self.hidden]
        self.scores = {i: s.detach() for i, s in self.scores.items()}


class Residual(nn.Module):
    """Post-norm residual sub-layer: ``norm(x + dropout(inner(x_in, ...)))``.

    The inner module reads ``x`` unless other inputs are given (attention inside a
    bottleneck may read the wide block input while its residual is the narrow one).
    """

    def __init__(self, inner: nn.Module, norm: nn.Module, drop: nn.Module) -> None:
        super().__init__()
        self.inner, self.norm, self.dropout = inner, norm, drop

    def forward(self, x: torch.Tensor, *inputs: torch.Tensor | None, **kwargs: object) -> torch.Tensor:
        y: torch.Tensor = self.norm(x + self.dropout(self.inner(*(inputs or (x,)), **kwargs)))
        return y


LAYER_RECOMPILE_LIMIT = 64
"""Graphs the compiled layer block may hold (torch.compile's default is 8 per function): one per layer
shape, input width and variant (the last layer at the prediction rows, a layer whose attention a trace
keeps), over every encoder a study's worker builds."""


def recompile_limit(limit: int) -> dict[str, int]:
    """``torch.compile``'s ``recompile_limit`` argument where it has one (torch 2.13 has it, 2.11 not);
    without it, dynamo's global limit raised to ``limit`` (never lowered), the only way those take it."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return {"recompile_limit": limit}
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, limit)
    return {}


class LayerBlock(nn.Module):
    """One layer, run on the modules it is handed (it holds none): what :meth:`Encoder.compile_layers`
    compiles. torch.compile inlines the modules and reads their weights as graph inputs, so one graph
    serves every layer of one shape, shared or not, of every encoder in the process: a later model that
    differs only in a head, an objective or a hyperparameter compiles no layer again."""

    def forward(
        self,
        attention: nn.Module,
        ffn_stack: nn.ModuleList,
        neck: Bottleneck | None,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        keep: list[torch.Tensor] | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, T, H) -> (B, T, H), or (R, H) at ``rows`` only; attention scores go to ``keep`` when given."""
        if neck is None:
            h: torch.Tensor = attention(x, x, mask, keep=keep)  # (B, T, H)
        else:
            h = neck.enter(x)  # (B, T, I)
            qk, v = neck.attention_inputs(x, h)  # (B, T, I or H), None or (B, T, H)
            h = attention(h, qk, mask, v, keep=keep)  # residual at I
        if rows is not None:  # what follows is per position
            h, x = h.flatten(0, 1)[rows], x.flatten(0, 1)[rows]  # (R, I), (R, H)
        for sublayer in ffn_stack:
            h = sublayer(h)  # (B, T, I)
        return h if neck is None else neck.leave(h, x)  # (B, T, H)

    def __deepcopy__(self, memo: dict[int, object]) -> LayerBlock:
        """A new block, uncompiled: a copied compiled call would run this block (a copied model is
        compiled, if at all, by whoever trains it)."""
        copy = memo[id(self)] = LayerBlock()
        copy.train(self.training)
        return copy


class Encoder(nn.Module):
    """Embeddings, then L blocks run as the plan says.

    Args:
        embeddings: the embedding module (output width H).
        attentions: the unique attention sub-layers.
        ffn_stacks: the unique stacks of F feed-forward sub-layers.
        bottlenecks: the unique bottlenecks (empty without ``model.intra_dim``).
        plan: per layer, the indices of its modules.
    """

    def __init__(
        self,
        embeddings: Embeddings,
        attentions: nn.ModuleList,
        ffn_stacks: nn.ModuleList,
        bottlenecks: nn.ModuleList,
        plan: list[Step],
    ) -> None:
        super().__init__()
        self.embeddings, self.attentions, self.ffn_stacks = embeddings, attentions, ffn_stacks
        self.bottlenecks, self.plan = bottlenecks, plan
        self.layer = LayerBlock()
        self.any_length = False  # the compiled block's graphs take any sequence length (compile_layers)

    def compile_layers(self, mode: str = "default", any_length: bool = False) -> None:
        """Compile the layer block (regional compilation): the stack's one graph per layer shape, reused
        by every layer and every later encoder of that shape; embeddings and heads stay eager.
        ``any_length``: the sequence length is a dimension of the graph rather than a constant (fine-tuning's
        few bucketed widths: one graph for all instead of one each)."""
        self.any_length = any_length
        self.layer.compile(mode=mode, **recompile_limit(LAYER_RECOMPILE_LIMIT))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        trace: Trace | None = None,
        rows: torch.Tensor | None = None,
        words: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids: (B, T); attention_mask: (B, T) bool, True on real tokens -> (B, T, H).

        ``words`` (B, T, E): word vectors to embed in place of the word embedding of ``input_ids``
        (:meth:`Embeddings.forward`; Zhao et al.'s teacher reading a mixed vocabulary).

        With a ``trace``, the embedding output, each layer's output and the attention scores
        it asks for are recorded in it, and the stack stops after ``trace.until``.

        With ``rows`` ((R,) long: indices into the flattened (B*T) positions whose output is
        needed, e.g. the masked ones and [CLS]), the last layer's attention still reads every
        position but its feed-forward stack (and bottleneck exit) runs on those rows only, and
        the output is ``(R, H)`` in that order: the same values, without the work on rows
        nobody reads. Nothing here depends on the values of the inputs (no host sync), so the
        forward compiles to one graph."""
        mask = None if attention_mask is None else attention_mask[:, None, None, :]  # (B, 1, 1, T), True = attend
        x: torch.Tensor = self.embeddings(input_ids, token_type_ids, words)  # (B, T, H)
        if self.any_length:  # T symbolic in the block's graph; once per forward (the first layer compiles it)
            torch._dynamo.maybe_mark_dynamic(x, 1)
            if mask is not None:
                torch._dynamo.maybe_mark_dynamic(mask, 3)
        if trace is not None:
            trace.embedding = x
        last = len(self.plan) - 1
        for i, step in enumerate(self.plan):
            keep: list[torch.Tensor] | None = [] if trace is not None and trace.wants_attention(i) else None
            x = self.block(x, step, mask, keep, rows if i == last else None)
            if trace is not None:
                trace.hidden.append(x)
                if keep:
                    trace.scores[i] = keep[0]
                if trace.until == i:
                    break
        return x

    def layer_modules(self, i: int) -> list[nn.Module]:
        """The modules layer i runs (shared ones are shared with other layers)."""
        step = self.plan[i]
        mods = [self.attentions[step.attention], self.ffn_stacks[step.ffn]]
        return mods + ([self.bottlenecks[step.bottleneck]] if self.bottlenecks else [])

    def block(
        self,
        x: torch.Tensor,
        step: Step,
        mask: torch.Tensor | None,
        keep: list[torch.Tensor] | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One layer: x (B, T, H) -> (B, T, H), or (N, H) at ``rows`` only; attention scores go
        to ``keep`` when given."""
        ffn = cast(nn.ModuleList, self.ffn_stacks[step.ffn])
        neck = cast(Bottleneck, self.bottlenecks[step.bottleneck]) if self.bottlenecks else None
        out: torch.Tensor = self.layer(self.attentions[step.attention], ffn, neck, x, mask, keep, rows)
        return out


def init_weights(module: nn.Module, std: float) -> None:
    """BERT initialisation: normal(0, std) weights, zero biases (norms keep their defaults)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_embeddings(cfg: ModelConfig) -> Embeddings:
    """Embeddings from the config's numbers."""
    E, H = cfg.embed_dim, cfg.hidden_dim
    trigram = Trigram(nn.Linear(3 * E, H)) if cfg.embedding == "trigram" else None
    width = H if trigram else E  # where position and token type are added
    return Embeddings(
        word=nn.Embedding(cfg.vocab_size, E, padding_idx=0),
        trigram=trigram,
        position=nn.Embedding(cfg.max_position, width) if cfg.position == "learned" else None,
        token_type=nn.Embedding(cfg.token_types, width) if cfg.token_types > 0 else None,
        norm=NORM2FN[cfg.norm](width, cfg.norm_eps) if cfg.embed_norm else nn.Identity(),
        dropout=dropout(cfg.dropout),
        projection=nn.Linear(E, H) if not trigram and E != H else None,
    )


def build_bottleneck(cfg: ModelConfig) -> Bottleneck:
    """The linear in/out of one block, wired as ``model.attention_input`` says."""
    H, I = cfg.hidden_dim, cfg.block_dim

    def projection() -> Projection:
        return Projection(nn.Linear(H, I), NORM2FN[cfg.norm](I, cfg.norm_eps))

    return Bottleneck(
        projection(),
        nn.Linear(I, H),
        NORM2FN[cfg.norm](H, cfg.norm_eps),
        dropout(cfg.dropout),
        shared_qk=projection() if cfg.attention_input == "shared_qk" else None,
        wide_attention=cfg.attention_input == "hidden",
    )


def build_attention(cfg: ModelConfig, spec: LayerSpec) -> Residual:
    """An attention sub-layer at the block width, reading what ``model.attention_input`` says."""
    H, I = cfg.hidden_dim, cfg.block_dim
    bottlenecked = cfg.intra_dim is not None
    q_in = H if bottlenecked and cfg.attention_input == "hidden" else I
    v_in = H if bottlenecked and cfg.attention_input == "shared_qk" else None
    inner = attention(q_in, spec.num_heads, spec.qk_dim, spec.v_dim, cfg.dropout, out_dim=I, v_in_dim=v_in)
    return Residual(inner, NORM2FN[cfg.norm](I, cfg.norm_eps), dropout(cfg.dropout))


def build_ffn_stack(cfg: ModelConfig, spec: LayerSpec) -> nn.ModuleList:
    """F feed-forward sub-layers at the block width."""
    I = cfg.block_dim
    return nn.ModuleList(
        Residual(
            feed_forward(I, spec.ffn_dim, cfg.activation), NORM2FN[cfg.norm](I, cfg.norm_eps), dropout(cfg.dropout)
        )
        for _ in range(cfg.num_ffn)
    )


def build_encoder(cfg: ModelConfig) -> Encoder:
    """Build the encoder described by ``cfg``, with sharing resolved by :func:`layer_plan`."""
    plan = layer_plan(cfg.num_layers, cfg.sharing)
    specs = cfg.layer_specs()

    def unique(kind: int) -> list[int]:  # the layer that first uses each unique module of a kind
        return sorted({step[kind]: i for i, step in reversed(list(enumerate(plan)))}.values())

    attentions = nn.ModuleList(build_attention(cfg, specs[i]) for i in unique(0))
    ffn_stacks = nn.ModuleList(build_ffn_stack(cfg, specs[i]) for i in unique(1))
    bottlenecks = nn.ModuleList(build_bottleneck(cfg) for _ in unique(2)) if cfg.intra_dim else nn.ModuleList()
    encoder = Encoder(build_embeddings(cfg), attentions, ffn_stacks, bottlenecks, plan)
    encoder.apply(lambda m: init_weights(m, cfg.init_std))
    return encoder
