"""Parameters and FLOPs of a model, counted the same way for every architecture: ``backbone``,
``heads``, ``paper_count``, ``flops_per_token`` and ``model_bytes`` by the counting rule of
docs/accounting.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn

from ablate.lightning_modules.config.experiment import ExperimentConfig, ObjectiveConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.measure.measuring import training_device
from ablate.lightning_modules.measure.profiling import measure, measure_latencies
from ablate.lightning_modules.model.components.attention import MultiHeadAttention
from ablate.lightning_modules.model.encoder import Encoder, Residual
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model


def count(module: nn.Module | None) -> int:
    """Unique parameters of a module (shared tensors once)."""
    return 0 if module is None else sum(p.numel() for p in module.parameters())


@dataclass(frozen=True)
class ParamReport:
    """What ``ablate params`` prints."""

    backbone: int
    embedding: int
    encoder: int
    heads: int
    mlm_head: int
    sentence_head: int
    pooler: int  # the pooler's size, counted in heads only when the sentence head exists
    paper_count: int
    flops_per_token: int
    seq_len: int
    model_bytes: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def linear_flops(module: nn.Module) -> int:
    """FLOPs per token of every Linear inside ``module`` (2 per multiply-add)."""
    return sum(2 * m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def flops_per_token(encoder: Encoder, seq_len: int) -> int:
    """Forward FLOPs per token of the backbone, walking the layer plan (shared layers run L times)."""
    total = linear_flops(encoder.embeddings)
    for step in encoder.plan:
        attn = cast(Residual, encoder.attentions[step.attention])
        heads = cast(MultiHeadAttention, attn.inner)
        total += linear_flops(attn) + 2 * seq_len * heads.num_heads * (heads.qk_dim + heads.v_dim)  # + QK^T, AV
        total += linear_flops(encoder.ffn_stacks[step.ffn])
        if len(encoder.bottlenecks):
            total += linear_flops(encoder.bottlenecks[step.bottleneck])
    return total


def param_report(model: PretrainingModel, cfg: ModelConfig, seq_len: int = 128) -> ParamReport:
    """Count a built model's parameters by part."""
    embedding = count(model.encoder.embeddings)
    backbone = count(model.encoder)
    pooler = cfg.hidden_dim * cfg.hidden_dim + cfg.hidden_dim  # dense H -> H (+ bias), present or not
    mlm = count(model.mlm_head)
    sentence = count(model.sentence_head)
    return ParamReport(
        backbone=backbone,
        embedding=embedding,
        encoder=backbone - embedding,
        heads=mlm + sentence,
        mlm_head=mlm,
        sentence_head=sentence,
        pooler=pooler,
        paper_count=backbone + pooler,
        flops_per_token=flops_per_token(model.encoder, seq_len),
        seq_len=seq_len,
        model_bytes=stored_bytes(model),
    )


def report_for(cfg: ModelConfig, objective: ObjectiveConfig | None = None, seq_len: int = 128) -> ParamReport:
    """Build the model on the meta device (no memory, instant even for xxlarge) and count it (a
    quantized model's size: :func:`ablate.lightning_modules.methods.quantization.apply.quantized_report`)."""
    import torch

    with torch.device("meta"):
        model = build_pretraining_model(cfg, objective or ObjectiveConfig())
    return param_report(model, cfg, seq_len)


def quantized_counts(quantized: PretrainingModel, cfg: ExperimentConfig) -> dict[str, float]:
    """A quantized model's ``model_bytes`` and (unless ``trainer.measure`` is off) its latency, measured
    on the CPU like every model's (:func:`metric_counts`; no activation memory: it does not train)."""
    import torch

    out: dict[str, float] = {"model_bytes": stored_bytes(quantized)}
    if cfg.trainer.measure:
        cpu = torch.device("cpu")
        out.update(measure_latencies(quantized, cfg.model.vocab_size, cfg.data.max_length, cpu, 5, 1, "32-true"))
    return out


MEASURED_ON = "measure.device"  # param: where latency and activation memory were measured


def metric_counts(
    model: PretrainingModel, model_cfg: ModelConfig, cfg: ExperimentConfig
) -> tuple[dict[str, float], dict[str, str]]:
    """Parameter counts, FLOPs/token and (unless ``trainer.measure`` is off) measured latency and
    memory; and the params saying where they were measured (``measure.device``).

    Latency (batch 1 and 32, T = ``data.max_length``: ``latency_ms_b1``, ``latency_ms_b32``, the
    minimum of the timed repeats, beside ``latency_ms_b1_spread``, ``latency_ms_b32_spread`` =
    (median - min) / min) and one training step's activation memory (at ``data.batch_size``) are
    measured on the device the run trains on, resolved from ``trainer.accelerator`` as Lightning
    resolves it (``auto`` = CUDA when available: ``cuda:0``, rank 0's), under the run's precision
    (``bf16-mixed``: the same autocast), eager, before the Trainer places the model (it is moved
    back, and the CPU and CUDA random streams are forked: a measured run trains exactly as an
    unmeasured one). On CUDA this initialises CUDA in this process, so a multi-GPU run then starts
    its DDP ranks by spawn (:func:`ablate.sweeps.engine.trainer.lightning_strategy`).
    """
    counts = param_report(model, model_cfg, cfg.data.max_length)
    out: dict[str, float] = {
        f"params.{k}": v for k, v in counts.as_dict().items() if k not in ("flops_per_token", "seq_len", "model_bytes")
    }
    out["flops_per_token"] = counts.flops_per_token
    out["model_bytes"] = counts.model_bytes
    if not cfg.trainer.measure:
        return out, {}
    device = training_device(cfg.trainer.accelerator)
    measured = measure(
        model,
        model_cfg.vocab_size,
        cfg.data.max_length,
        device=device,
        repeats=5,
        warmup=1,
        memory_batch=cfg.data.batch_size,
        precision=cfg.trainer.precision,
    )
    out.update({k: cast(float, v) for k, v in measured.as_dict().items() if k != "device"})  # the rest are floats
    return out, {MEASURED_ON: measured.device}


def holds_integers(t: torch.Tensor) -> bool:
    """Whether ``t`` stores its values as integers: a torch.ao quantized tensor, or a tensor subclass
    (torchao's quantized weights) with an integer inner tensor. A float tensor, a parameter of one
    (a fake-quantized QAT weight) or a subclass of float tensors only is not."""
    if t.is_quantized:
        return True
    if type(t) in (torch.Tensor, nn.Parameter) or not hasattr(t, "__tensor_flatten__"):
        return False
    names, _ = t.__tensor_flatten__()
    inner = [getattr(t, name) for name in names]
    return any(
        isinstance(x, torch.Tensor) and (not (x.is_floating_point() or x.is_complex()) or holds_integers(x))
        for x in inner
    )


def _tensor_bytes(t: torch.Tensor) -> float:
    """Bytes of a tensor as stored: each inner tensor of a torchao tensor at its own dtype, a
    quantized weight's values at their bit width (int4 values: half a byte), torch.ao's qint8 with
    its per-channel scales and zero points."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, nn.Parameter):
        names, meta = t.__tensor_flatten__()
        bits = getattr(meta, "get", lambda *_: None)("target_dtype") if isinstance(meta, dict) else None
        total = 0.0
        for name in names:
            inner = getattr(t, name)
            if name == "qdata" and isinstance(bits, torch.dtype) and bits.itemsize <= 1:
                total += inner.numel() * _bits(bits) / 8
            else:
                total += _tensor_bytes(inner)
        return total
    if t.is_quantized:
        extra = 0.0
        if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            extra = t.q_per_channel_scales().nelement() * 8 + t.q_per_channel_zero_points().nelement() * 8
        return t.numel() * t.element_size() + extra
    return float(t.numel() * t.element_size())


def _bits(dtype: torch.dtype) -> int:
    name = str(dtype).removeprefix("torch.")
    digits = "".join(c for c in name if c.isdigit())
    return int(digits) if name.startswith(("int", "uint")) and digits else dtype.itemsize * 8


def stored_bytes(model: nn.Module) -> int:
    """The bytes ``model``'s weights take, each tensor at its dtype (tied tensors once)."""
    seen: set[int] = set()
    kept: list[torch.Tensor] = []  # alive until the end: an id is unique only among live objects
    total = 0.0
    for module in model.modules():
        tensors: list[torch.Tensor] = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        packed: Any = module  # torch.ao's quantized Linear keeps weight and bias packed, behind methods
        if getattr(packed, "_packed_params", None) is not None and callable(getattr(packed, "weight", None)):
            bias = packed.bias()
            tensors += [packed.weight(), *([] if bias is None else [bias])]
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                kept.append(t)
                total += _tensor_bytes(t)
    return round(total)
