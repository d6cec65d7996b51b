"""A quantized model as it is deployed: its integer weights and scales, written
(``model/quantized.safetensors`` and ``model/quantization.yaml``: :class:`QuantMeta`) and read back
(:func:`read_quantized`: the model the run scored, bit for bit; :func:`dequantized`: its float model
with dequantized weights). docs/guides/quantization.md, "The quantized model, kept", says what each
file holds and how the model is rebuilt."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

import torch
import yaml
from torch import nn

from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.load import load_config
from ablate.lightning_modules.config.yamlio import load_yaml
from ablate.lightning_modules.interop.classifier import load_classifier
from ablate.lightning_modules.interop.pretrained import load_pretrained
from ablate.lightning_modules.interop.qa_export import load_span_model
from ablate.lightning_modules.methods.quantization.apply import LayerBits, quantize, quantized_layers

QUANTIZED = "quantized.safetensors"
QUANT_YAML = "quantization.yaml"
FORMAT = 1
DYNAMIC, TORCHAO = "torch.ao-dynamic", "torchao"
INNER = ("qdata", "scale", "zero_point")
"""The tensors of a quantized weight, stored as ``<layer>.weight.<name>``."""


class LayerEntry(TypedDict, total=False):
    """A quantized layer as ``quantization.yaml`` describes it (torch.ao's: ``axis``; torchao's: ``tensor``,
    ``block_size``, ``activation``, ``packed``)."""

    kind: str
    bits: int
    shape: list[int]
    axis: int
    tensor: str
    block_size: list[int]
    activation: str | None
    packed: bool


class QuantMeta(TypedDict):
    """``quantization.yaml``: how the run quantized its model, and each quantized layer by name."""

    format: int
    method: str
    group_size: int
    embeddings: str
    qat_steps: int
    avg_bits: float | None
    plan: dict[str, int]
    layers: dict[str, LayerEntry]


@dataclass(frozen=True)
class QuantizedModel:
    """A quantized run's model as it was scored (:func:`read_quantized`).

    Attributes:
        cfg: The run's config.
        model: The quantized model in eval mode on the CPU, of the run's float model's class
            (``PretrainingModel``, ``Classifier`` or ``SpanModel``), its quantized layers as the run
            scored them: its outputs are the run's, bit for bit (the same kernels on the same integers).
        plan: Bits per quantized layer, embedding tables included.
        layers: Each quantized layer's entry of ``quantization.yaml``.
    """

    cfg: ExperimentConfig
    model: nn.Module
    plan: LayerBits
    layers: dict[str, LayerEntry]

    @property
    def method(self) -> str:
        """``quant.method`` of the run (``none`` when only the embedding tables are quantized)."""
        return self.cfg.quant.method


def _bits(dtype: torch.dtype) -> int:
    return 8 if dtype == torch.int8 else int(str(dtype).removeprefix("torch.int"))


def pack(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes in [-8, 7] as uint8, two per byte (low nibble first; an odd count padded with 0)."""
    flat = (codes.flatten().to(torch.int16) + 8).to(torch.uint8)
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    return flat[0::2] | (flat[1::2] << 4)


def unpack(packed: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """:func:`pack`'s codes back as int8 of ``shape``."""
    pairs = torch.stack([packed & 0xF, packed >> 4], dim=1).flatten()
    count = 1
    for n in shape:
        count *= n
    return (pairs[:count].to(torch.int16) - 8).to(torch.int8).reshape(shape)


def _layer(module: nn.Module) -> tuple[LayerEntry, dict[str, torch.Tensor]]:
    """A quantized layer's ``quantization.yaml`` entry and its tensors (``weight.qdata`` ...)."""
    weight = getattr(module, "weight")  # noqa: B009 - a method of torch.ao's layer, a tensor of torchao's
    if callable(weight):  # torch.ao dynamic int8: a packed per-channel quantized tensor
        w = weight()
        bias = module.bias()  # type: ignore[operator]
        tensors = {
            "weight.qdata": w.int_repr(),
            "weight.scale": w.q_per_channel_scales(),
            "weight.zero_point": w.q_per_channel_zero_points(),
            **({"bias": bias.detach()} if bias is not None else {}),
        }
        entry: LayerEntry = {"kind": DYNAMIC, "bits": 8, "axis": int(w.q_per_channel_axis()), "shape": list(w.shape)}
        return entry, tensors
    names, ctx = weight.__tensor_flatten__()
    if tuple(names) != INNER:
        raise TypeError(f"a torchao weight of {type(weight).__name__} holds {names}, not {INNER}")
    bits = _bits(ctx["target_dtype"])
    qdata = weight.qdata
    entry = LayerEntry(
        kind=TORCHAO,
        tensor=type(weight).__name__,
        bits=bits,
        block_size=list(ctx["block_size"]),
        activation=ctx.get("activation_quantization"),
        shape=list(qdata.shape),
        packed=bits <= 4,
    )
    tensors = {
        "weight.qdata": pack(qdata) if bits <= 4 else qdata,
        "weight.scale": weight.scale,
        "weight.zero_point": weight.zero_point,
    }
    return entry, tensors


def quantized_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, LayerEntry]]:
    """``model``'s tensors as stored (quantized layers as integers and scales, the rest as it runs) and
    its quantized layers' entries, by layer name."""
    layers: dict[str, LayerEntry] = {}
    tensors: dict[str, torch.Tensor] = {}
    for name in quantized_layers(model):
        entry, own = _layer(model.get_submodule(name))
        layers[name] = entry
        tensors.update({f"{name}.{key}": t for key, t in own.items()})
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        owner, _, attr = name.rpartition(".")
        if owner in layers and attr == "weight":
            continue  # stored as integers above
        tensors.setdefault(name, t.detach())
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, layers


def write_quantized(
    model: nn.Module, cfg: ExperimentConfig, plan: LayerBits | None, bits: float | None, folder: Path
) -> list[Path]:
    """``model`` (quantized as ``cfg.quant`` and ``plan`` say) as ``quantized.safetensors`` and
    ``quantization.yaml`` in ``folder``; the paths written."""
    from safetensors.torch import save_file

    tensors, layers = quantized_state(model)
    q = cfg.quant
    meta: QuantMeta = {
        "format": FORMAT,
        "method": q.method,
        "group_size": q.group_size,
        "embeddings": q.embeddings,
        "qat_steps": q.qat_steps,
        "avg_bits": bits,
        "plan": {name: int(b) for name, b in (plan or {}).items()},
        "layers": layers,
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / QUANTIZED), metadata={"format": "pt", "ablate.quantization": str(FORMAT)})
    (folder / QUANT_YAML).write_text(yaml.safe_dump(meta, sort_keys=False), encoding="utf-8")
    return [folder / QUANTIZED, folder / QUANT_YAML]


def _float_model(folder: Path, cfg: ExperimentConfig) -> nn.Module:
    """The run's float model from its ``model/`` folder (the architecture its config builds)."""
    if cfg.regime == "finetune" and cfg.finetune.kind == "span":
        return load_span_model(folder)[1]
    if cfg.regime == "finetune":
        return load_classifier(folder)[1]
    return load_pretrained(folder)[1]


def _fill(model: nn.Module, name: str, entry: LayerEntry, stored: dict[str, torch.Tensor], where: Path) -> None:
    """Layer ``name`` of ``model`` (built quantized as the run's was) given the stored integers and scales."""
    module = model.get_submodule(name)
    built, _ = _layer(module)
    same = ("kind", "bits", "block_size", "activation", "shape")
    if any(built.get(k) != entry.get(k) for k in same):
        raise DataError(
            f"{where}: layer {name} was stored as {entry.get('kind')} {entry.get('bits')}-bit "
            f"{entry.get('block_size') or ''}, but quantizing the run's model builds {built.get('kind')} "
            f"{built.get('bits')}-bit {built.get('block_size') or ''} (another torch or torchao version?)"
        )
    qdata = stored[f"{name}.weight.qdata"]
    if entry.get("packed"):
        qdata = unpack(qdata, tuple(entry["shape"]))
    scale, zero_point = stored[f"{name}.weight.scale"], stored[f"{name}.weight.zero_point"]
    with torch.no_grad():
        if entry["kind"] == DYNAMIC:
            packed = torch._make_per_channel_quantized_tensor(qdata, scale, zero_point, entry["axis"])
            module.set_weight_bias(packed, stored.get(f"{name}.bias"))  # type: ignore[operator]
            return
        weight = getattr(module, "weight")  # noqa: B009 - a torchao tensor subclass
        for attr, value in zip(INNER, (qdata, scale, zero_point), strict=True):
            getattr(weight, attr).copy_(value)


def read_meta(folder: Path) -> QuantMeta:
    """``quantization.yaml`` of a ``model/`` folder; DataError when it is missing or unreadable."""
    path = Path(folder) / QUANT_YAML
    try:
        meta = load_yaml(path.read_text(encoding="utf-8"))  # strict: a key given twice is refused
    except (OSError, yaml.YAMLError) as exc:
        said = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line, without PyYAML's excerpt
        raise DataError(f"{path}: cannot read the quantized model's description ({said})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("layers"), dict):
        raise DataError(f"{path}: not a quantized model's description (format {FORMAT})")
    return cast(QuantMeta, meta)  # its form checked above


def read_quantized(folder: Path) -> QuantizedModel:
    """The quantized model a run's ``model/`` folder holds (:class:`QuantizedModel`); DataError
    when it holds none or its layers are not what the run's quantization builds."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = read_meta(folder)
    cfg = load_config(folder / "config.yaml")
    layers = meta["layers"]
    plan = {name: int(e["bits"]) for name, e in layers.items()}
    model = quantize(_float_model(folder, cfg), cfg.quant, meta.get("plan") or None)
    built = set(quantized_layers(model))
    if built != set(layers):
        missing = sorted(built ^ set(layers))
        raise DataError(f"{folder / QUANT_YAML}: its layers differ from the run's quantized model's ({missing[0]})")
    stored = load_file(str(folder / QUANTIZED))
    for name, entry in layers.items():
        _fill(model, name, entry, stored, folder / QUANTIZED)
    rest = {name: t for name, t in [*model.named_parameters(), *model.named_buffers()] if name in stored}
    with torch.no_grad():
        for name, t in rest.items():
            if name.rpartition(".")[0] not in layers:
                t.copy_(stored[name])
    return QuantizedModel(cfg, model.eval(), plan, layers)


def dequantized(folder: Path) -> tuple[ExperimentConfig, nn.Module]:
    """The run's float model with each quantized layer's weight replaced by its dequantized weight
    (``(qdata - zero_point) * scale``, the values a weight-only layer computes with); tied tables stay
    tied. Activation quantization (``dynamic-int8``, ``qat-int8``) is not part of it."""
    stored = read_quantized(folder)
    model = _float_model(Path(folder), stored.cfg)
    with torch.no_grad():
        for name, entry in stored.layers.items():
            weight: Any = getattr(stored.model.get_submodule(name), "weight")  # noqa: B009
            values = weight().dequantize() if entry["kind"] == DYNAMIC else weight.dequantize()
            cast(torch.Tensor, model.get_submodule(name).weight).copy_(values)
    return stored.cfg, model.eval()
