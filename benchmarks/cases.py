"""The configurations ``ablate bench`` compares, as plain functions (one per case).

Each is expressible as a transformers model (:func:`lightning_modules.interop_maps.family`),
with dropout off so that both sides do exactly the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lightning_modules.config import ModelConfig
from lightning_modules.presets import albert_small


@dataclass(frozen=True)
class Case:
    """One benchmark configuration.

    Attributes:
        name: what the table calls it.
        model: the architecture (both sides).
        sentence: ``sop`` (ALBERT) or ``nsp`` (BERT, MobileBERT): the second pre-training loss.
        seq_len: tokens per sequence T.
        batch: sequences per step B.
        mask_prob: share of tokens with an MLM label.
    """

    name: str
    model: ModelConfig
    sentence: str
    seq_len: int = 128
    batch: int = 16
    mask_prob: float = 0.15


def albert_tiny() -> Case:
    """ALBERT, V=8192, H=256, L=4, E=128, 4 heads, FFN 1024, all layers shared; MLM + SOP."""
    return Case("albert-tiny", replace(albert_small(), max_position=128, dropout=0.0), "sop")


def bert_tiny() -> Case:
    """The same, not shared and not factorized (E = H = 256): BERT; MLM + NSP."""
    return Case("bert-tiny", replace(albert_small(), sharing="none", embed_dim=256, max_position=128, dropout=0.0),
                "nsp")


def mobilebert_small() -> Case:
    """A small MobileBERT: V=8192, E=64 (trigram), inter-block 256, intra-block 64, L=4, 4 heads,
    FFN 256 x 4, NoNorm, ReLU, Q/K from the shared bottleneck; MLM + NSP."""
    model = ModelConfig(vocab_size=8192, embed_dim=64, hidden_dim=256, intra_dim=64, num_layers=4, num_heads=4,
                        ffn_dim=256, num_ffn=4, norm="no_norm", activation="relu", embedding="trigram",
                        attention_input="shared_qk", max_position=128, dropout=0.0, mlm_head="mobilebert")
    return Case("mobilebert-small", model, "nsp")


CASES: dict[str, Callable[[], Case]] = {"albert-tiny": albert_tiny, "bert-tiny": bert_tiny,
                                        "mobilebert-small": mobilebert_small}
