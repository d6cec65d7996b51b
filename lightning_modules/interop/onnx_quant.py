"""Quantized ONNX exports (``ablate export --format onnx --quantize ...``): ``dynamic-int8``,
``static-int8`` (calibrated on :data:`~ablate.lightning_modules.interop.onnx_check.CALIBRATION_ROWS`
training rows) and weight-only ``MatMulNBits`` at :data:`NBITS` bits, made by
``onnxruntime.quantization`` from the checked fp32 graph; a dev metric more than :data:`MAX_DROP`
points under ablate's fp32 model's fails the export (docs/guides/interop.md, "ONNX")."""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.interop.onnx_check import (
    METRICS,
    Check,
    TaskRows,
    feed,
    metric,
    outputs,
    predictions,
    require_onnx,
    session,
    torch_outputs,
)
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.span import SpanModel

NBITS = (2, 4, 8)  # MatMulNBits' weight widths (onnxruntime 1.32: "Only support 2, 4 or 8 bits quantization")
BLOCK_SIZE = 32
MAX_DROP = 1.0  # points of the dev metric a quantized export may lose against fp32
_WEIGHT_ONLY = re.compile(r"(?:weight-)?int(\d+)")


@dataclass(frozen=True)
class Quantizer:
    """One ``--quantize`` choice: how it quantizes (``run`` returns what it did: kept in ``onnx.json``)."""

    run: Callable[[Path, Path, TaskRows, int], dict[str, object]]  # fp32 in, quantized out, rows, bits
    bits: int = 8


def _dynamic(src: Path, dst: Path, rows: TaskRows, bits: int) -> dict[str, object]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(src, dst, per_channel=True, reduce_range=False, weight_type=QuantType.QInt8)
    return {"method": "dynamic-int8", "weights": "int8, per channel", "activations": "uint8, per batch at run time"}


class _Calibration:
    """``CalibrationDataReader``'s protocol over training batches (ONNX Runtime's input dicts)."""

    def __init__(self, rows: TaskRows) -> None:
        self._batches = iter([feed(batch) for batch in rows.train])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def _static(src: Path, dst: Path, rows: TaskRows, bits: int) -> dict[str, object]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    reader = type("Reader", (_Calibration, CalibrationDataReader), {})(rows)
    quantize_static(
        src,
        dst,
        reader,
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul", "Gemm"],
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    calibrated = sum(len(b["input_ids"]) for b in rows.train)
    return {
        "method": "static-int8",
        "format": "QDQ",
        "weights": "int8, per channel",
        "activations": f"uint8, ranges calibrated (MinMax) on {calibrated} training rows",
    }


def _weight_only(src: Path, dst: Path, rows: TaskRows, bits: int) -> dict[str, object]:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(str(src)), bits=bits, block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=4)
    chatty = logging.getLogger(MatMulNBitsQuantizer.__module__)  # a line per MatMul at INFO
    level = chatty.level
    chatty.setLevel(logging.WARNING)
    try:
        q.process()
    finally:
        chatty.setLevel(level)
    q.model.save_model_to_file(str(dst), use_external_data_format=False)
    return {
        "method": f"weight-int{bits}",
        "weights": f"int{bits}, block-wise (MatMulNBits, {BLOCK_SIZE} per scale, symmetric)",
        "activations": "float32 (int8 compute, accuracy_level 4)",
    }


QUANTIZERS: dict[str, Quantizer] = {
    "dynamic-int8": Quantizer(_dynamic),
    "static-int8": Quantizer(_static),
    "int4": Quantizer(_weight_only, 4),  # the name for weight-int4
    **{f"weight-int{bits}": Quantizer(_weight_only, bits) for bits in NBITS},
}


def parse(quantize: str) -> Quantizer:
    """``--quantize``'s value -> its quantizer. ConfigError for an unknown one, or weight-only bits
    ``MatMulNBits`` cannot hold (``int3``, ``weight-int16``)."""
    if quantize in QUANTIZERS:
        return QUANTIZERS[quantize]
    match = _WEIGHT_ONLY.fullmatch(quantize)
    if match is not None:
        widths = ", ".join(map(str, NBITS))
        raise ConfigError(
            f"--quantize {quantize}: ONNX Runtime's MatMulNBits holds {widths}-bit weights, not {match.group(1)}-bit "
            f"(weight-int2, int4, weight-int8)"
        )
    raise ConfigError(f"--quantize: {quantize!r} is not one of {', '.join(QUANTIZERS)}")


RUN_FORMS = {"dynamic-int8": "dynamic-int8", "qat-int8": "static-int8"}
"""A quantized run's ``quant.method`` -> the ``--quantize`` that writes it as ONNX (int8 with activations
quantized: per batch at run time as torch.ao's dynamic layers, or calibrated ranges as QAT's converted ones);
a uniform weight-only method -> MatMulNBits at its bits (:func:`run_form`)."""


def run_form(method: str, plan: Mapping[str, int]) -> str:
    """The ``--quantize`` that writes a quantized run's model (``quant.method``, its ``plan`` of bits per
    layer) as ONNX. ConfigError for a form ONNX Runtime cannot hold: a plan of several widths (Q-BERT's mixed
    plans: ``MatMulNBitsQuantizer`` writes every MatMul at one width) or a width ``MatMulNBits`` lacks."""
    if method in RUN_FORMS:
        return RUN_FORMS[method]
    widths = sorted(set(plan.values()))
    if len(widths) != 1 or widths[0] not in NBITS:
        raise ConfigError(
            f"--format onnx: the run's quant.method {method} gives its layers {', '.join(map(str, widths))} bits; "
            f"ONNX Runtime's MatMulNBits writes one width for the whole graph ({' or '.join(map(str, NBITS))} bits): "
            "pick it with --quantize (int4, weight-int8, weight-int2), checked against the run's own model"
        )
    return f"weight-int{widths[0]}"


def _ablate_dynamic(model: Classifier | SpanModel, rows: TaskRows) -> list[torch.Tensor]:
    from ablate.lightning_modules.methods.quantization.apply import quantize_dynamic_int8

    return torch_outputs(quantize_dynamic_int8(copy.deepcopy(model)), rows)


def _agreement(a: list[torch.Tensor], b: list[torch.Tensor], rows: TaskRows) -> float | None:
    pa, pb = predictions(a, rows), predictions(b, rows)
    return None if pa is None or pb is None else float((pa == pb).double().mean()) * 100


def quantized(
    quantize: str,
    model: Classifier | SpanModel,
    src: Path,
    dst: Path,
    rows: TaskRows,
    fp32: list[torch.Tensor],
    own: tuple[nn.Module, str] | None = None,
) -> tuple[Check, dict[str, object]]:
    """Quantize the fp32 graph ``src`` into ``dst`` as ``quantize`` says and check it on ``rows`` against
    ablate's fp32 outputs ``fp32`` and ablate's own quantized model: ``own`` (a quantized run's model as it
    scored it, and what it is), else for dynamic int8 torch.ao's dynamic int8 of ``model``.

    Raises:
        ConfigError: an unknown quantization, bits MatMulNBits lacks, ONNX Runtime failing to quantize, a
            dev metric more than :data:`MAX_DROP` points under fp32's, or (``own``) more than that away from
            the run's own quantized model's.
    """
    quantizer = parse(quantize)
    _, ort = require_onnx()
    try:
        how = quantizer.run(src, dst, rows, quantizer.bits)
        got = outputs(session(dst), rows)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime.quantization raises of many kinds
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"--quantize {quantize}: ONNX Runtime cannot quantize this model ({first})") from None
    how["library"] = f"onnxruntime {ort.__version__}"
    ablate_q, ablate_name = None, None
    if own is not None:
        ablate_q, ablate_name = torch_outputs(own[0], rows), own[1]
    elif quantize == "dynamic-int8":
        ablate_q, ablate_name = _ablate_dynamic(model, rows), "ablate's dynamic-int8 (torch.ao)"
    name = METRICS[rows.kind][0]
    check = Check(
        rows=rows.dev_rows,
        metric_name=name,
        metric_torch=metric(fp32, rows),
        metric_onnx=metric(got, rows),
        agreement=_agreement(got, fp32, rows),
        agreement_ablate=None if ablate_q is None else _agreement(got, ablate_q, rows),
        ablate_quantized=ablate_name,
        metric_ablate_quantized=None if ablate_q is None else metric(ablate_q, rows),
    )
    if own is not None and check.metric_ablate_quantized is not None:
        apart = abs(check.metric_onnx - check.metric_ablate_quantized)
        if not apart <= MAX_DROP:
            raise ConfigError(
                f"--quantize {quantize}: the quantized graph's dev {name} is {check.metric_onnx:.2f} against "
                f"{check.metric_ablate_quantized:.2f} for {own[1]} on {check.rows} dev rows, more than "
                f"{MAX_DROP:g} point apart; nothing written"
            )
    drop = check.metric_torch - check.metric_onnx
    if not drop <= MAX_DROP:
        raise ConfigError(
            f"--quantize {quantize}: the quantized model's dev {name} is {check.metric_onnx:.2f} against fp32's "
            f"{check.metric_torch:.2f} on {check.rows} dev rows, more than {MAX_DROP:g} point lower; nothing written"
        )
    return check, how
