"""The ``quant`` section of the config: quantization, the fifth compression family.

``quant.method`` says how the run's model is quantized; ``quant.source`` makes quantizing a
trained model a run of its own (the ``quant`` regime). Without a source, the method applies to
the model the run trains: post-training methods quantize it when training ends (a distilled or
pruned model, quantized), ``qat-int8`` trains it with fake quantization and converts it at the end.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.errors import STRICT
from ablate.lightning_modules.fields import PosInt

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


@dataclass(frozen=True, config=STRICT)
class QuantConfig:
    """How the run's model is quantized (the encoder's Linear layers; embedding tables, norms and
    heads stay in floating point).

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
        calib_batches: training batches over which each layer's sensitivity (the loss increase
            when that layer alone is quantized to ``low_bits``) is measured.
    """

    method: Method = "none"
    source: str | None = None
    group_size: PosInt = 32
    low_bits: Bits = 4
    high_bits: Bits = 8
    high_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.25
    rank: Literal["sensitivity", "reverse"] = "sensitivity"
    calib_batches: PosInt = 4

    @model_validator(mode="after")
    def _check_bits(self) -> QuantConfig:
        if self.method == "weight-mixed" and self.high_bits <= self.low_bits:
            raise ValueError(f"high_bits: {self.high_bits} must be above low_bits {self.low_bits}")
        return self

    @property
    def enabled(self) -> bool:
        """Whether the run's model ends quantized."""
        return self.method != "none"

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
            "weight-mixed": ("group_size", "low_bits", "high_bits", "high_fraction", "rank", "calib_batches"),
        }
        return ("method", "source", *by_method.get(self.method, ("group_size",)))
