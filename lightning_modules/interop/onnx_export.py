"""A fine-tuned model as an ONNX graph (``ablate export --format onnx``), checked against ablate's own:
:func:`to_onnx` traces a classifier or span model (FastBERT's exits left out), :func:`export_onnx`
writes the folder (``model.onnx``, tokenizer, ``ablate.yaml``, ``onnx.json``, card) through
:func:`~ablate.lightning_modules.interop.hub.staged`, so a failed check leaves nothing
(docs/guides/interop.md, "ONNX"). Imports without the ``onnx`` extra."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig, to_yaml
from ablate.lightning_modules.interop.classifier import EXPORT_YAML, export_labels, label_names
from ablate.lightning_modules.interop.hub import CARD, redact, save_tokenizer, staged
from ablate.lightning_modules.interop.onnx_card import onnx_card
from ablate.lightning_modules.interop.onnx_check import (
    INPUTS,
    METRICS,
    Check,
    TaskRows,
    inputs,
    metric,
    outputs,
    require_onnx,
    session,
    torch_outputs,
)
from ablate.lightning_modules.interop.onnx_quant import quantized
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.span import SpanModel

ONNX_FILE, ONNX_META = "model.onnx", "onnx.json"
FP32_STEM = ".fp32"  # the fp32 graph while a quantized one is made from it
PARITY_TOL = 1e-4  # max |ONNX Runtime fp32 - PyTorch| over the dev rows' outputs
OPSET = 18
NO_EXITS = "FastBERT's early exits not exported: the final classifier, every layer run"


class _Graph(nn.Module):
    """What the graph computes: int64 inputs (HF's convention) -> the model's outputs, named."""

    def __init__(self, model: Classifier | SpanModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask.bool(), "token_type_ids": token_type_ids}
        out: torch.Tensor = self.model(batch)
        if isinstance(self.model, SpanModel):
            start, end = out.unbind(-1)
            return start, end
        return out


def output_names(model: Classifier | SpanModel) -> list[str]:
    return ["start_logits", "end_logits"] if isinstance(model, SpanModel) else ["logits"]


def to_onnx(model: Classifier | SpanModel, path: Path, example: dict[str, torch.Tensor]) -> None:
    """Write ``model`` (eval mode) to ``path`` as one ONNX file with dynamic batch and sequence axes.

    Raises:
        ConfigError: the exporter cannot express the model (its first line named).
    """
    require_onnx()
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    shapes = {name: {0: batch, 1: seq} for name in INPUTS}
    args = tuple(example[name].long() for name in INPUTS)
    graph = _Graph(model).eval()
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's notes on axis names and deprecations
            torch.onnx.export(
                graph,
                args,
                str(path),
                input_names=list(INPUTS),
                output_names=output_names(model),
                dynamic_shapes=shapes,
                opset_version=OPSET,
                dynamo=True,
                external_data=False,
                verbose=False,
            )
    except Exception as exc:  # noqa: BLE001 - the exporter's errors are of many kinds
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"--format onnx: the model cannot be expressed in ONNX ({first})") from None
    finally:
        registry.setLevel(level)


def parity(model: Classifier | SpanModel, path: Path, rows: TaskRows) -> tuple[Check, list[torch.Tensor]]:
    """ONNX Runtime's fp32 outputs against ``model``'s on the dev rows; ConfigError over :data:`PARITY_TOL`.
    Also returns PyTorch's outputs (the quantized checks compare with them)."""
    want, got = torch_outputs(model, rows), outputs(session(path), rows)
    diff = max(float((w - g).abs().max()) for w, g in zip(want, got, strict=True))
    if not diff <= PARITY_TOL:
        raise ConfigError(
            f"--format onnx: parity check failed: ONNX Runtime's outputs differ from ablate's by up to {diff:.2e} "
            f"on {rows.dev_rows} dev rows (tolerance {PARITY_TOL:g}); nothing written"
        )
    name = METRICS[rows.kind][0]
    check = Check(rows.dev_rows, name, metric(want, rows), metric(got, rows), max_abs_diff=diff)
    return check, want


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote and checked."""

    quantize: str | None
    parity: Check
    check: Check | None  # the quantized graph's, None for fp32
    notes: tuple[str, ...]
    tokenizer: bool

    def describe(self) -> str:
        """The printed line's detail: parity, the quantized check, the notes."""
        p = self.parity
        parts = [f"parity: ONNX Runtime fp32 within {p.max_abs_diff:.1e} of PyTorch on {p.rows} dev rows"]
        q = self.check
        if q is not None:
            text = f"{self.quantize}: {q.metric_name} {q.metric_onnx:.2f} against fp32 {q.metric_torch:.2f}"
            if q.agreement is not None:
                text += f", {q.agreement:.1f}% of predictions as fp32"
            if q.agreement_ablate is not None:
                text += f", {q.agreement_ablate:.1f}% as {q.ablate_quantized}"
            if q.metric_ablate_quantized is not None:
                text += f" (its {q.metric_name} {q.metric_ablate_quantized:.2f})"
            parts.append(text)
        return "; ".join([*parts, *self.notes])


def _shapes(model: Classifier | SpanModel) -> dict[str, list[str | int]]:
    """Each output's shape: ``logits`` ``(batch, num_labels)``, or ``(batch, sequence)`` start and end logits."""
    if isinstance(model, Classifier):
        return {"logits": ["batch", model.num_labels]}
    return {name: ["batch", "sequence"] for name in output_names(model)}


def _meta(
    model: Classifier | SpanModel,
    cfg: ExperimentConfig,
    result: OnnxExport,
    labels: list[str] | None,
    how: dict[str, object],
) -> dict[str, object]:
    axes = ["batch", "sequence"]
    outs = _shapes(model)
    return {
        "format": "onnx",
        "file": ONNX_FILE,
        "opset": OPSET,
        "task": cfg.finetune.task,
        "kind": cfg.finetune.kind,
        "inputs": {name: {"dtype": "int64", "shape": axes} for name in INPUTS},
        "outputs": {name: {"dtype": "float32", "shape": shape} for name, shape in outs.items()},
        "labels": labels,
        "max_length": min(cfg.finetune.max_length, cfg.model.max_position),
        "quantization": how or None,
        "early_exits": None if getattr(model, "exits", None) is None else "not exported",
        "checks": {
            "parity": asdict(result.parity),
            "quantized": None if result.check is None else asdict(result.check),
        },
    }


def export_onnx(
    model: Classifier | SpanModel,
    cfg: ExperimentConfig,
    out_dir: Path,
    rows: TaskRows,
    *,
    quantize: str | None = None,
    tokenizer: Path | None = None,
    labels: Sequence[str] | None = None,
    own: tuple[nn.Module, str] | None = None,
    source: str | None = None,
) -> OnnxExport:
    """Write ``model`` to the new folder ``out_dir`` as ONNX (fp32, or quantized as ``quantize`` says: one of
    :data:`~ablate.lightning_modules.interop.onnx_quant.QUANTIZERS`), checked on ``rows`` (a quantized graph
    also against ``own``: a quantized run's model as it scored it, and what it is), with its card (``README.md``,
    :mod:`~ablate.lightning_modules.interop.onnx_card`; ``source``: where the model comes from, ``runs:/RUN_ID``).

    Raises:
        ConfigError: onnx extra missing, a quantization ONNX Runtime cannot hold, a model the exporter cannot
            express, the parity check (fp32 over :data:`PARITY_TOL`) or the quantized check failing.
    """
    require_onnx()
    model = model.eval()
    names = None
    if isinstance(model, Classifier) and cfg.finetune.kind == "classification":
        names = label_names(model.num_labels, export_labels(cfg.finetune, model.num_labels, labels))
    elif labels is not None:
        raise ConfigError(f"--labels: a {cfg.finetune.kind} task's model has no class names")
    notes = (NO_EXITS,) if getattr(model, "exits", None) is not None else ()
    with staged(out_dir) as tmp:
        fp32 = tmp / ONNX_FILE
        to_onnx(model, fp32, inputs(rows.dev[0]))
        check, want = parity(model, fp32, rows)
        q_check: Check | None = None
        how: dict[str, object] = {}
        if quantize is not None:  # the quantized graph replaces the fp32 one
            unquantized = fp32.replace(tmp / f"{FP32_STEM}.onnx")
            q_check, how = quantized(quantize, model, unquantized, fp32, rows, want, own)
            unquantized.unlink()
        result = OnnxExport(quantize, check, q_check, notes, tokenizer is not None)
        if tokenizer is not None:
            length = min(cfg.finetune.max_length, cfg.model.max_position)
            save_tokenizer(tokenizer, tmp, cfg.data.lowercase, length, required=False)
        (tmp / EXPORT_YAML).write_text(redact(to_yaml(cfg)), encoding="utf-8")
        meta = _meta(model, cfg, result, names, how)
        (tmp / ONNX_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        checks = (check, q_check)
        card = onnx_card(
            cfg,
            _shapes(model),
            names,
            checks,
            quantize=quantize,
            source=source,
            tolerance=PARITY_TOL,
            exits=bool(notes),
        )
        (tmp / CARD).write_text(card, encoding="utf-8")
    return result
