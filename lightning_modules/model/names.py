"""Where a pre-training model keeps its parameters: the dotted module names that pruning gates, layer
surgery and checkpoint interop address, written once here, after the attributes of
:class:`~ablate.lightning_modules.model.heads.PretrainingModel` and
:class:`~ablate.lightning_modules.model.encoder.Encoder` (unique modules, as :func:`layer_plan` lays
them out); each takes an optional ``part``: ``attention(2, "inner.qkv")`` is ``'encoder.attentions.2.inner.qkv'``."""

from __future__ import annotations

ENCODER = "encoder"
MLM_HEAD = "mlm_head"
SENTENCE_HEAD = "sentence_head"
ATTENTIONS = f"{ENCODER}.attentions"
FFN_STACKS = f"{ENCODER}.ffn_stacks"
BOTTLENECKS = f"{ENCODER}.bottlenecks"
EMBEDDINGS = f"{ENCODER}.embeddings"
TOKEN_EMBEDDINGS = ("word", "position", "token_type")
"""The embedding tables inside ``embeddings`` (position and token type may be absent)."""


def _join(*parts: object) -> str:
    return ".".join(str(p) for p in parts if p != "")


def embeddings(part: str = "") -> str:
    """The embedding module (tables, ``norm``, ``projection``, ``trigram``)."""
    return _join(EMBEDDINGS, part)


def attention(i: int, part: str = "") -> str:
    """The ``i``-th unique attention sub-layer (``inner.qkv``, ``inner.out``, ``norm``)."""
    return _join(ATTENTIONS, i, part)


def ffn(i: int, j: int, part: str = "") -> str:
    """Feed-forward sub-layer ``j`` of the ``i``-th unique stack (``inner.up``, ``inner.down``, ``norm``)."""
    return _join(FFN_STACKS, i, j, part)


def ffn_stack(i: int) -> str:
    """The ``i``-th unique stack of feed-forward sub-layers."""
    return _join(FFN_STACKS, i)


def bottleneck(i: int, part: str = "") -> str:
    """The ``i``-th unique bottleneck (MobileBERT's ``inp``, ``out``, ``shared``)."""
    return _join(BOTTLENECKS, i, part)


def mlm_head(part: str = "") -> str:
    """The MLM head (``transform``, ``norm``, ``bias``, ``extra``)."""
    return _join(MLM_HEAD, part)


def sentence_head(part: str = "") -> str:
    """The NSP/SOP head (``pooler``, ``classifier``); absent without a sentence objective."""
    return _join(SENTENCE_HEAD, part)
