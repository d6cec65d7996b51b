"""The artifact a user deploys, rebuilt for a report to time (:mod:`ablate.reports.remeasure`), from a run's
config with random weights (:func:`deployed`): a fine-tuned model as the ONNX graph ``ablate export --format
onnx`` writes, quantized as its run's was where ONNX Runtime can hold it (:data:`ORT_FORMS`), run by ONNX
Runtime; otherwise PyTorch, the reason said (:attr:`Deployed.why`). Each target's ``label`` names its
runtime and form (docs/reports.md, "Remeasured by default, as deployed")."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.measure.deployed import Call, Target, TorchTarget
from ablate.lightning_modules.measure.measuring import random_batch
from ablate.lightning_modules.measure.retime import Quantizer, rebuilt, timing_device
from ablate.lightning_modules.model.classifier import Classifier, build_classifier
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.lightning_modules.model.span import SpanModel, build_span_model

if TYPE_CHECKING:
    from onnxruntime import InferenceSession


@dataclass(frozen=True)
class Form:
    """How a quantized fine-tuned model is deployed as ONNX: the ``--quantize`` it is exported with (None: fp32)
    and the label its latency carries."""

    quantize: str | None
    label: str


#: ``quant.method`` -> its ONNX form. ``qat-int8`` converts to int8 weights per channel with int8 activations
#: quantized per token at run time: ONNX Runtime's dynamic int8 is that form.
ORT_FORMS: dict[str, Form] = {
    "none": Form(None, "ORT fp32"),
    "dynamic-int8": Form("dynamic-int8", "ORT int8"),
    "qat-int8": Form("dynamic-int8", "ORT int8"),
    "weight-int8": Form("weight-int8", "ORT int8 weight-only"),
    "weight-int4": Form("int4", "ORT int4 weight-only"),
    "weight-int2": Form("weight-int2", "ORT int2 weight-only"),
}
#: ``quant.method`` -> why ONNX Runtime cannot run it as quantized (timed in PyTorch instead).
NOT_IN_ONNX: dict[str, str] = {
    **{f"weight-int{b}": f"MatMulNBits holds 2-, 4- and 8-bit weights, not {b}-bit" for b in (3, 5, 6)},
    "weight-mixed": "a mixed-bit plan has no ONNX form (ablate export --quantize is one width for every layer)",
}
#: The PyTorch label of a quantized run's model, by ``quant.method`` (``PyTorch`` where not quantized).
TORCH_LABELS: dict[str, str] = {
    "dynamic-int8": "PyTorch int8",
    "qat-int8": "PyTorch int8",
    "weight-mixed": "PyTorch mixed weight-only",
    **{f"weight-int{b}": f"PyTorch int{b} weight-only" for b in (2, 3, 4, 5, 6, 8)},
}


def _encoder(model: nn.Module, batch: dict[str, torch.Tensor]) -> object:
    return model.get_submodule("encoder")(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])


def _whole(model: nn.Module, batch: dict[str, torch.Tensor]) -> object:
    return model(batch)


def _quantizer() -> Quantizer:
    from ablate.lightning_modules.methods.quantization.apply import quantized_like

    return quantized_like


def seq_len(cfg: ExperimentConfig) -> int:
    """The tokens per row a run's deployed model is timed at: a fine-tuning run's ``finetune.max_length``
    (within ``model.max_position``, as its export says), else ``data.max_length`` (as the run timed itself)."""
    if cfg.regime == "finetune":
        return min(cfg.finetune.max_length, cfg.model.max_position)
    return cfg.data.max_length


def task_model(cfg: ExperimentConfig) -> Classifier | SpanModel:
    """A fine-tuning run's model with random weights (seed 0; the caller's random streams untouched), no exits."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pre = build_pretraining_model(cfg.model, cfg.objective)
        if cfg.finetune.kind == "span":
            return build_span_model(pre, 0.02)
        return build_classifier(pre, cfg.finetune.num_labels, 0.0, 0.02)


@dataclass
class OrtTarget:
    """An ONNX graph run by ONNX Runtime on the CPU, one session per thread count (made on first use)."""

    path: Path
    vocab_size: int
    seq_len: int
    label: str
    device: torch.device = torch.device("cpu")
    sessions: dict[int, InferenceSession] = field(default_factory=dict)

    def call(self, threads: int, batch: int) -> Call:
        from ablate.lightning_modules.interop.onnx_check import feed, session

        if threads not in self.sessions:
            self.sessions[threads] = session(self.path, threads)
        sess = self.sessions[threads]
        inputs = feed(random_batch(self.vocab_size, batch, self.seq_len, torch.device("cpu")))
        return lambda: sess.run(None, inputs)


@dataclass(frozen=True)
class Deployed:
    """A run's deployed artifact, ready to time: the target, and why it is not ONNX Runtime's (None if it is)."""

    target: Target
    why: str | None = None


def _onnx(cfg: ExperimentConfig, form: Form, folder: Path) -> OrtTarget:
    """The run's graph as ``ablate export --format onnx [--quantize]`` writes it, in ``folder``."""
    from ablate.lightning_modules.interop.onnx_check import TaskRows, inputs
    from ablate.lightning_modules.interop.onnx_export import to_onnx
    from ablate.lightning_modules.interop.onnx_quant import QUANTIZERS

    length = seq_len(cfg)
    example = inputs(random_batch(cfg.model.vocab_size, 2, length, torch.device("cpu")))
    fp32 = folder / "fp32.onnx"
    to_onnx(task_model(cfg), fp32, example)
    path = fp32
    if form.quantize is not None:
        quantizer = QUANTIZERS[form.quantize]
        path = folder / f"{form.quantize}.onnx"
        root = logging.getLogger()  # onnxruntime.quantization advises pre-processing on the root logger
        level = root.level
        root.setLevel(logging.ERROR)
        try:
            quantizer.run(fp32, path, TaskRows(cfg.finetune.kind, [], []), quantizer.bits)
        except Exception as exc:  # noqa: BLE001 - onnxruntime.quantization raises of many kinds
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ConfigError(f"ONNX Runtime cannot quantize it as {form.quantize} ({first})") from None
        finally:
            root.setLevel(level)
        fp32.unlink()
    return OrtTarget(path, cfg.model.vocab_size, length, form.label)


def _torch(cfg: ExperimentConfig) -> TorchTarget:
    """The run's model in PyTorch: a fine-tuning run's whole model on the CPU, else the encoder as the run timed it."""
    q = cfg.quant
    label = TORCH_LABELS.get(q.method, "PyTorch") if q.enabled else "PyTorch"
    if cfg.regime == "finetune":
        model: nn.Module = task_model(cfg)
        if q.enabled:
            model = _quantizer()(model, q)
        return TorchTarget(model, _whole, cfg.model.vocab_size, seq_len(cfg), torch.device("cpu"), label=label)
    device = timing_device(cfg)
    precision = "32-true" if q.enabled else cfg.trainer.precision
    model = rebuilt(cfg, _quantizer())
    return TorchTarget(model, _encoder, cfg.model.vocab_size, seq_len(cfg), device, precision, label)


def onnx_available() -> str | None:
    """None with the ``onnx`` extra installed, else why not (one line)."""
    from ablate.lightning_modules.interop.onnx_check import require_onnx

    try:
        require_onnx()
    except ConfigError as exc:
        return str(exc)
    return None


def deployed(cfg: ExperimentConfig, folder: Path) -> Deployed:
    """The artifact a run with ``cfg`` deploys (see the module), its ONNX files written into ``folder``."""
    if cfg.regime != "finetune":
        return Deployed(_torch(cfg), "a pre-trained model (no task head): timed as its encoder in PyTorch")
    method = cfg.quant.method
    if method in NOT_IN_ONNX:
        return Deployed(_torch(cfg), f"quant.method {method}: {NOT_IN_ONNX[method]}")
    if (missing := onnx_available()) is not None:
        return Deployed(_torch(cfg), missing)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return Deployed(_onnx(cfg, ORT_FORMS[method], folder))
    except ConfigError as exc:
        return Deployed(_torch(cfg), str(exc))


def key(cfg: ExperimentConfig) -> tuple[str, ...]:
    """What makes two runs' deployed artifacts time the same (seeds differ only in values): the model, its
    quantization, the task's head, the sequence length, the precision and the device."""
    head = f"{cfg.finetune.kind}:{cfg.finetune.num_labels}" if cfg.regime == "finetune" else "encoder"
    device = "cpu" if cfg.regime == "finetune" else str(timing_device(cfg))
    return (repr(cfg.model), repr(cfg.quant), head, str(seq_len(cfg)), cfg.trainer.precision, device)
