"""The ``quant`` section of the config: quantization, the fifth compression family. ``quant.method``
says how the run's model is quantized; ``quant.source`` makes quantizing a trained model a run of
its own (the ``quant`` regime). Without a source, post-training methods quantize the trained model
when training ends, and ``qat-int8`` trains it with fake quantization (docs/guides/quantization.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT, FieldError
from ablate.lightning_modules.config.fields import NonNegInt, PosInt
from ablate.lightning_modules.config.model import ModelConfig

Method = Literal[
    "none",
    "dynamic-int8",
    "weight-int8",
    "weight-int6",
    "weight-int5",
    "weight-int4",
    "weight-int3",
    "weight-int2",
    "weight-mixed",
    "qat-int8",
]
Bits = Annotated[int, Field(ge=2, le=8)]
WEIGHT_BITS: dict[str, int] = {f"weight-int{b}": b for b in (8, 6, 5, 4, 3, 2)}
"""Uniform weight-only methods and their bits per weight."""
EMBEDDING_BITS: dict[str, int] = {"int8": 8, "int4": 4}
"""Quantized embedding tables and their bits per weight (one scale per row)."""


@dataclass(frozen=True, config=STRICT)
class QuantConfig:
    """How the run's model is quantized (the encoder's Linear layers, and the embedding tables when
    ``embeddings`` says; norms and heads stay in floating point).

    Attributes:
        method: ``none``; ``dynamic-int8`` (post-training dynamic quantization: int8 weights per
            output channel, activations quantized per batch at run time; torch.ao's fbgemm/x86
            kernels); ``weight-int8`` ... ``weight-int2`` (weight-only, group-wise, torchao's
            ``IntxWeightOnlyConfig``: weights stored at that many bits, computed in fp32);
            ``weight-mixed`` (Q-BERT's mixed precision: the most sensitive layers get
            ``high_bits``, the rest ``low_bits``); ``qat-int8`` (quantization-aware training:
            torchao fake-quantizes int8 weights per channel and int8 activations per token during
            the run's training, then converts).
        source: the trained model to quantize: ``runs:/RUN_ID``, an ``ablate export`` folder or a
            transformers checkpoint; its run is the ``quant`` regime. None: quantize the model
            this run trains.
        group_size: weights per scale of the weight-only methods (must divide every quantized
            layer's input width).
        low_bits: ``weight-mixed``: bits of the less sensitive layers.
        high_bits: ``weight-mixed``: bits of the most sensitive layers.
        high_fraction: ``weight-mixed``: the share of the quantized weights given ``high_bits``,
            most sensitive layers first (a layer goes up only when it fits the share).
        rank: ``weight-mixed``: ``sensitivity`` gives the high bits to the most sensitive layers,
            ``reverse`` to the least sensitive (the control at the same size).
        sensitivity: ``weight-mixed``: how a layer's sensitivity is measured on the calibration
            batches: ``loss`` (the loss increase when that layer alone is quantized to ``low_bits``)
            or ``hessian`` (Q-BERT's: the top eigenvalue of the loss's Hessian with respect to the
            layer's weights, by power iteration, ranked by its mean + std over the batches).
        hessian_iters: ``sensitivity: hessian``: at most this many Hessian-vector products per layer
            and batch (power iteration stops earlier when the estimate settles to 1e-3).
        calib_batches: training batches over which each layer's sensitivity is measured.
        embeddings: the word and token-type embedding tables: ``none`` (float), ``int8`` or ``int4``
            (weight-only, one scale per row, torchao); counted in ``model_bytes``. The position table
            stays in floating point.
        qat_steps: quantization-aware training before the weights are converted (Q-BERT): after the
            run's own training, this many steps with the weights (and quantized embeddings)
            fake-quantized at their bits, group-wise, then converted. Weight-only methods only, in a
            fine-tuning run or the ``quant`` regime; 0 = post-training quantization.
    """

    method: Method = "none"
    source: str | None = None
    group_size: PosInt = 32
    low_bits: Bits = 4
    high_bits: Bits = 8
    high_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.25
    rank: Literal["sensitivity", "reverse"] = "sensitivity"
    sensitivity: Literal["loss", "hessian"] = "loss"
    hessian_iters: PosInt = 50
    calib_batches: PosInt = 4
    embeddings: Literal["none", "int8", "int4"] = "none"
    qat_steps: NonNegInt = 0

    @model_validator(mode="after")
    def _check_bits(self) -> QuantConfig:
        if self.method == "weight-mixed" and self.high_bits <= self.low_bits:
            raise FieldError("high_bits", f"high_bits {self.high_bits} must be above low_bits {self.low_bits}")
        if self.qat_steps and self.method not in (*WEIGHT_BITS, "weight-mixed"):
            raise FieldError(
                "qat_steps",
                f"quantization-aware training at 2-8 bits needs a weight-only method "
                f"(weight-int2 ... weight-int8, weight-mixed), not {self.method!r}"
                + ("; qat-int8 trains fake-quantized for the run's own steps" if self.method == "qat-int8" else ""),
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether the run's model ends quantized (its encoder, its embedding tables or both)."""
        return self.method != "none" or self.embeddings != "none"

    @property
    def average_bits(self) -> float | None:
        """Bits per quantized weight when known from the config alone (None: ``none``, mixed, dynamic)."""
        if self.method in WEIGHT_BITS:
            return float(WEIGHT_BITS[self.method])
        return 8.0 if self.method in ("dynamic-int8", "qat-int8") else None

    def used_fields(self) -> tuple[str, ...]:
        """The fields this method reads (the rest are not logged)."""
        by_method = {
            "none": (),
            "dynamic-int8": (),
            "qat-int8": (),
            "weight-mixed": (
                "group_size",
                "low_bits",
                "high_bits",
                "high_fraction",
                "rank",
                "sensitivity",
                "calib_batches",
            ),
        }
        fields = by_method.get(self.method, ("group_size",))
        if self.method == "weight-mixed" and self.sensitivity == "hessian":
            fields = (*fields, "hessian_iters")
        if self.method in WEIGHT_BITS or self.method == "weight-mixed":
            fields = (*fields, "qat_steps")
        return ("method", "source", "embeddings", *fields)


def input_widths(m: ModelConfig) -> set[int]:
    """The input widths of the Linear layers quantization applies to (what ``group_size`` groups):
    the hidden and embedding widths, each layer's attention output and feed-forward widths, and
    MobileBERT's bottleneck."""
    widths = {m.hidden_dim}
    if m.embedding == "trigram":
        widths.add(3 * m.embed_dim)  # the trigram embedding's projection
    elif m.embed_dim != m.hidden_dim:
        widths.add(m.embed_dim)  # ALBERT's E -> H
    for spec in m.layer_specs():
        widths |= {spec.num_heads * spec.v_dim, spec.ffn_dim}
    if m.intra_dim is not None:
        widths.add(m.intra_dim)
    return widths


def check_group_size(q: QuantConfig, m: ModelConfig) -> None:
    """FieldError (``quant.group_size: ...``) when a weight-only method's group size divides none of the
    model's quantized layers' input widths (every layer would fall back to one scale per row)."""
    if q.method not in WEIGHT_BITS and q.method != "weight-mixed":
        return
    widths = input_widths(m)
    if not any(w % q.group_size == 0 for w in widths):
        raise FieldError(
            "quant.group_size",
            f"{q.group_size} divides none of the quantized layers' input widths "
            f"({', '.join(map(str, sorted(widths)))})",
        )
