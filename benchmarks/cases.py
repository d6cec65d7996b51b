"""The configurations ``ablate bench`` compares, as plain functions (one per case).

Each is expressible as a transformers model (:func:`ablate.lightning_modules.interop.maps.family`),
with dropout off so that both sides do exactly the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ablate.lightning_modules.config.experiment import Sentence
from ablate.lightning_modules.config.model import MOBILEBERT_EPS, ModelConfig
from ablate.lightning_modules.config.presets import albert_base as albert_base_preset
from ablate.lightning_modules.config.presets import albert_small, ibbert_large, ibbert_mini, mobilebert_mini
from ablate.lightning_modules.config.presets import bert_base as bert_base_preset
from ablate.lightning_modules.config.presets import mobilebert as mobilebert_preset


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
        targets: what the table checks: ``fp32`` (ablate fp32 over transformers' best fp32),
            ``best`` (ablate's best over transformers' best), ``mfu`` (ablate's best step's
            share of the bf16 matmul peak), ``compiled`` (ablate bf16 compiled over eager),
            ``bf16`` (ablate's best bf16 over its own fp32); absent = not checked.
        teacher: a distillation case's frozen teacher (same vocabulary, layers and heads as
            ``model``); a step is then the teacher's forward and the student's step with MLM,
            the sentence loss, KD, FMT and AT (MobileBERT's ``auxiliary`` strategy). None: pre-training.
    """

    name: str
    model: ModelConfig
    sentence: Sentence
    seq_len: int = 128
    batch: int = 16
    mask_prob: float = 0.15
    targets: tuple[tuple[str, float], ...] = ()
    teacher: ModelConfig | None = None


def albert_tiny() -> Case:
    """ALBERT, V=8192, H=256, L=4, E=128, 4 heads, FFN 1024, all layers shared; MLM + SOP."""
    return Case(
        "albert-tiny",
        replace(albert_small(), max_position=128, dropout=0.0),
        "sop",
        targets=(("fp32", 1.6), ("best", 3.0)),
    )


def bert_tiny() -> Case:
    """The same, not shared and not factorized (E = H = 256): BERT; MLM + NSP."""
    return Case(
        "bert-tiny",
        replace(albert_small(), sharing="none", embed_dim=256, max_position=128, dropout=0.0),
        "nsp",
        targets=(("fp32", 1.6),),
    )


def mobilebert_small() -> Case:
    """A small MobileBERT: V=8192, E=64 (trigram), inter-block 256, intra-block 64, L=4, 4 heads,
    FFN 256 x 4, NoNorm, ReLU, Q/K from the shared bottleneck; MLM + NSP."""
    model = ModelConfig(
        vocab_size=8192,
        embed_dim=64,
        hidden_dim=256,
        intra_dim=64,
        num_layers=4,
        num_heads=4,
        ffn_dim=256,
        num_ffn=4,
        norm="no_norm",
        activation="relu",
        embedding="trigram",
        attention_input="shared_qk",
        max_position=128,
        dropout=0.0,
        mlm_head="mobilebert",
    )
    return Case("mobilebert-small", model, "nsp", targets=(("fp32", 1.3),))


def ibbert_for(model: ModelConfig) -> ModelConfig:
    """An IB-BERT teacher as transformers' MobileBERT can express it: Q and K from a shared
    bottleneck (``attention_input: shared_qk``), transformers' LayerNorm epsilon, MobileBERT's MLM head."""
    return replace(model, attention_input="shared_qk", norm_eps=MOBILEBERT_EPS, mlm_head="mobilebert", dropout=0.0)


def distill_mini() -> Case:
    """MobileBERT's distillation at CPU size: an ``ibbert-mini`` teacher (H=128, intra-block 256, FFN
    1024, LayerNorm, GELU) and a ``mobilebert-mini`` student (intra-block 32, F=2, NoNorm, ReLU),
    V=8192, L=4, 4 heads, trigram E=32; MLM + NSP + KD + FMT + AT."""
    student = replace(mobilebert_mini(), mlm_head="mobilebert", dropout=0.0)
    return Case("distill-mini", student, "nsp", teacher=ibbert_for(ibbert_mini()))


def micro() -> Case:
    """A 1-layer BERT so small that its step takes a few milliseconds on one CPU thread (V=512, H=E=32,
    2 heads, FFN 64; T=16, B=4; MLM + NSP): what a loop costs per step besides its step, the host time
    that a GPU's fast step cannot hide, shows at its full size. Its teacher (for ``--regime distill``)
    has the same shape with a wider FFN."""
    model = ModelConfig(
        vocab_size=512,
        embed_dim=32,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        ffn_dim=64,
        max_position=16,
        dropout=0.0,
    )
    return Case("micro", model, "nsp", seq_len=16, batch=4, teacher=replace(model, ffn_dim=128))


# GPU-sized cases: T=128, B=128, dropout off (both sides do the same arithmetic)
def bert_small() -> Case:
    """BERT-small: V=16384, H=E=512, L=4, 8 heads, FFN 2048; MLM + NSP."""
    model = ModelConfig(
        vocab_size=16384,
        embed_dim=512,
        hidden_dim=512,
        num_layers=4,
        num_heads=8,
        ffn_dim=2048,
        max_position=128,
        dropout=0.0,
    )
    return Case("bert-small", model, "nsp", batch=128, targets=(("best", 1.5), ("compiled", 1.2)))


def bert_base() -> Case:
    """BERT-base (V=30000, H=768, L=12, 12 heads, FFN 3072); MLM + NSP."""
    return Case(
        "bert-base",
        replace(bert_base_preset(), max_position=128, dropout=0.0),
        "nsp",
        batch=128,
        targets=(("best", 1.8), ("mfu", 0.40)),
    )


def albert_base() -> Case:
    """ALBERT-base (V=30000, E=128, H=768, L=12, all shared); MLM + SOP."""
    return Case(
        "albert-base",
        replace(albert_base_preset(), max_position=128, dropout=0.0),
        "sop",
        batch=128,
        targets=(("best", 1.8),),
    )


def mobilebert() -> Case:
    """MobileBERT (24 layers, inter-block 512, intra-block 128, F=4, NoNorm, ReLU, trigram); MLM + NSP."""
    return Case(
        "mobilebert",
        replace(mobilebert_preset(), max_position=128, dropout=0.0),
        "nsp",
        batch=128,
        targets=(("best", 1.5), ("bf16", 1.5), ("compiled", 1.2)),
    )


def distill_mobilebert() -> Case:
    """MobileBERT's own distillation: IB-BERT-large (24 layers, inter-block 512, intra-block 1024,
    FFN 4096) teaching MobileBERT; MLM + NSP + KD + FMT + AT."""
    return Case(
        "distill-mobilebert",
        replace(mobilebert_preset(), max_position=128, dropout=0.0),
        "nsp",
        batch=128,
        teacher=ibbert_for(replace(ibbert_large(), max_position=128)),
    )


CPU_CASES: dict[str, Callable[[], Case]] = {
    "albert-tiny": albert_tiny,
    "bert-tiny": bert_tiny,
    "mobilebert-small": mobilebert_small,
    "distill-mini": distill_mini,
}
GPU_CASES: dict[str, Callable[[], Case]] = {
    "bert-small": bert_small,
    "bert-base": bert_base,
    "albert-base": albert_base,
    "mobilebert": mobilebert,
    "distill-mobilebert": distill_mobilebert,
}
HOST_CASES: dict[str, Callable[[], Case]] = {"micro": micro}
"""Cases for the loop's host time (``ablate bench loop --case micro``), named only on purpose."""
CASES: dict[str, Callable[[], Case]] = {**CPU_CASES, **GPU_CASES, **HOST_CASES}


def default_cases(device_type: str) -> list[str]:
    """The cases a suite runs when none is named: the GPU-sized ones on CUDA, else the CPU ones."""
    return list(GPU_CASES if device_type == "cuda" else CPU_CASES)
