"""The ``model`` section of the config: the encoder architecture (BERT / ALBERT / MobileBERT /
schuBERT per-layer dimensions), validated once. Re-exported by :mod:`ablate.lightning_modules.config.experiment`."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT, FieldError
from ablate.lightning_modules.config.fields import NonNegInt, PosFloat, PosInt, Prob

Sharing = Literal["none", "all", "attn", "ffn"]
# sharing mode -> (share attention across layers, share feed-forward stacks across layers)
SHARES: dict[str, tuple[bool, bool]] = {
    "none": (False, False),
    "all": (True, True),
    "attn": (True, False),
    "ffn": (False, True),
}
Norm = Literal["layer_norm", "no_norm"]
Activation = Literal["gelu", "relu"]


MOBILEBERT_EPS = 1e-5
"""The LayerNorm epsilon Hugging Face's MobileBERT hard-codes (its config's ``layer_norm_eps`` is ignored)."""


@dataclass(frozen=True, config=STRICT)
class LayerSpec:
    """One layer's dimensions (schuBERT): heads a_i, per-head query/key width k_i, per-head
    value width v_i and feed-forward width f_i. k_i != v_i is allowed."""

    num_heads: PosInt
    qk_dim: PosInt
    v_dim: PosInt
    ffn_dim: PosInt


@dataclass(frozen=True, config=STRICT)
class ModelConfig:
    """Encoder architecture (BERT/ALBERT family).

    Attributes:
        vocab_size: V, also the size of the WordPiece tokenizer trained for the run.
        embed_dim: E, the word-embedding size; E != H adds an E->H projection.
        hidden_dim: H, the width of the residual stream.
        num_layers: L, transformer blocks run (shared blocks still run L times).
        num_heads: A, attention heads; H must be divisible by A.
        ffn_dim: inner size of each feed-forward sub-layer.
        num_ffn: F, stacked feed-forward sub-layers per block (MobileBERT), each with
            its own residual and norm.
        intra_dim: width inside a block (MobileBERT): None = H, no bottleneck; otherwise
            each block has a linear H -> intra_dim in and intra_dim -> H out, with the
            residual between blocks at H. Narrower than H is MobileBERT's bottleneck,
            wider is IB-BERT's inverted bottleneck.
        attention_input: with a bottleneck, where attention reads from: ``bottleneck``
            (Q, K, V from the narrow block input), ``hidden`` (Q, K, V from the H-wide
            block input; IB-BERT) or ``shared_qk`` (Q, K from a second, shared H ->
            intra_dim bottleneck, V from the H-wide input; the released MobileBERT).
        embedding: ``plain`` (word + position + token type at width E, then E -> H) or
            ``trigram`` (MobileBERT: word embeddings of t+1, t, t-1 concatenated, 3E ->
            H, then position and token type at H).
        layers: per-layer dimensions (schuBERT); None = every layer uses ``num_heads``
            heads of width intra_dim / num_heads and ``ffn_dim``.
        mlm_head: ``factorized`` (BERT/ALBERT: H -> E transform, norm, decoder tied to the
            V x E word embedding) or ``mobilebert`` (H -> H transform, LayerNorm, decoder
            ``[word embedding V x E ; extra V x (H - E)]``, as released MobileBERT).
        sharing: cross-layer sharing, ``none | all | attn | ffn`` (ALBERT).
        norm: ``layer_norm`` or ``no_norm`` (MobileBERT's ``h * gamma + beta``).
        activation: ``gelu`` or ``relu``.
        position: ``learned`` absolute position embeddings or ``none``.
        max_position: rows of the position embedding.
        token_types: rows of the token-type embedding; 0 removes it.
        embed_norm: norm after the embedding sum.
        dropout: dropout on embeddings, attention probabilities and sub-layer outputs;
            0 removes the dropout modules.
        norm_eps: epsilon of LayerNorm.
        init_std: std of the normal initialisation of weights.
    """

    vocab_size: PosInt = 30000
    embed_dim: PosInt = 128
    hidden_dim: PosInt = 768
    num_layers: PosInt = 12
    num_heads: PosInt = 12
    ffn_dim: PosInt = 3072
    num_ffn: PosInt = 1
    intra_dim: PosInt | None = None
    attention_input: Literal["bottleneck", "hidden", "shared_qk"] = "bottleneck"
    embedding: Literal["plain", "trigram"] = "plain"
    layers: tuple[LayerSpec, ...] | None = None
    mlm_head: Literal["factorized", "mobilebert"] = "factorized"
    sharing: Sharing = "none"
    norm: Norm = "layer_norm"
    activation: Activation = "gelu"
    position: Literal["learned", "none"] = "learned"
    max_position: PosInt = 512
    token_types: NonNegInt = 2
    embed_norm: bool = True
    dropout: Prob = 0.1
    norm_eps: PosFloat = 1e-12
    init_std: PosFloat = 0.02

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        width = "hidden_dim" if self.intra_dim is None else "intra_dim"
        if self.layers is None and self.block_dim % self.num_heads:
            raise FieldError("num_heads", f"{width} {self.block_dim} is not divisible by num_heads {self.num_heads}")
        if self.layers is not None and len(self.layers) != self.num_layers:
            raise FieldError("layers", f"gives {len(self.layers)} layers but num_layers is {self.num_layers}")
        if self.embedding == "trigram" and self.embed_dim > self.hidden_dim:
            raise FieldError(
                "embed_dim", f"a trigram embedding needs E <= H, got E={self.embed_dim} > H={self.hidden_dim}"
            )
        if self.mlm_head == "mobilebert" and self.embed_dim > self.hidden_dim:
            raise FieldError("mlm_head", f"'mobilebert' decodes at H and needs E <= H, got E={self.embed_dim}")
        if self.attention_input != "bottleneck" and self.intra_dim is None:
            raise FieldError("attention_input", f"{self.attention_input!r} needs a bottleneck (set model.intra_dim)")
        specs = self.layer_specs()
        share_attn, share_ffn = SHARES[self.sharing]
        for i, spec in enumerate(specs[1:], start=1):
            first = specs[0]
            attn_differs = (spec.num_heads, spec.qk_dim, spec.v_dim) != (first.num_heads, first.qk_dim, first.v_dim)
            if (share_attn and attn_differs) or (share_ffn and spec.ffn_dim != first.ffn_dim):
                raise FieldError(
                    "sharing",
                    f"{self.sharing!r} shares modules across layers, but model.layers "
                    f"differ at layer {i} ({spec} vs {first})",
                )
        return self

    @property
    def head_dim(self) -> int:
        """Width of one attention head in the uniform short form, block width / A."""
        return self.block_dim // self.num_heads

    @property
    def block_dim(self) -> int:
        """Width inside a block: intra_dim with a bottleneck, else H."""
        return self.intra_dim or self.hidden_dim

    def layer_specs(self) -> tuple[LayerSpec, ...]:
        """Per-layer dimensions, from ``layers`` or the uniform fields."""
        if self.layers is not None:
            return self.layers
        uniform = LayerSpec(num_heads=self.num_heads, qk_dim=self.head_dim, v_dim=self.head_dim, ffn_dim=self.ffn_dim)
        return (uniform,) * self.num_layers
