"""Quantize a model's encoder as ``quant.method`` says, with the libraries made for it (torch.ao's
``quantize_dynamic``, torchao's ``IntxWeightOnlyConfig`` and QAT): :func:`quantize`, :func:`prepare_qat` and
:func:`convert_qat`, :func:`prepare_weight_qat` and :func:`convert_weight_qat`, :func:`quantize_embeddings`. Each
checks that every layer it was to quantize holds integers (:func:`is_quantized`), else raises
:class:`QuantizationNotApplied`; docs/guides/quantization.md."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from torchao.core.config import AOBaseConfig

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ObjectiveConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.quant import EMBEDDING_BITS, WEIGHT_BITS, QuantConfig
from ablate.lightning_modules.measure.accounting import (
    ParamReport,
    holds_integers,
    param_report,
    report_for,
    stored_bytes,
)
from ablate.lightning_modules.model.heads import build_pretraining_model

LayerBits = dict[str, int]
"""Bits per quantized layer, by its name in the model (``encoder.attentions.0.inner.qkv``)."""


@contextmanager
def _quiet() -> Iterator[None]:
    """torch.ao's eager quantization warns that it is deprecated in favour of torchao; on a CPU its
    fbgemm/x86 int8 GEMM is the fast dynamic int8 path (torchao 0.18's ran slower than float32 on
    the development machine): hide the warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=r".*quantize_per_tensor, torch\.quantize_per_channel.*")
        yield


class QuantizationNotApplied(RuntimeError):
    """A quantization left layers it was to quantize in floating point (one line, naming them)."""


def is_quantized(module: nn.Module) -> bool:
    """Whether ``module``'s weight is stored quantized: torch.ao's packed int8 (a dynamic quantized
    Linear, whose ``weight`` is a method) or integer data in a torchao tensor."""
    weight = getattr(module, "weight", None)
    if callable(weight) and getattr(module, "_packed_params", None) is not None:
        weight = weight()
    return isinstance(weight, torch.Tensor) and holds_integers(weight)


def quantized_layers(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules whose weights are stored quantized (:func:`is_quantized`)."""
    return [name for name, m in model.named_modules() if name and is_quantized(m)]


def _backends() -> str:
    """The libraries and engine a quantization ran on, for an error message."""
    try:
        from importlib.metadata import version

        torchao = version("torchao")
    except Exception:  # noqa: BLE001 - only a detail of a message
        torchao = "unknown"
    engine = torch.backends.quantized.engine
    return f"torch {torch.__version__}, torchao {torchao}, torch.backends.quantized.engine {engine}"


def check_quantized(model: nn.Module, names: list[str], method: str) -> nn.Module:
    """``model``, once every layer of ``names`` holds integer weights (:func:`is_quantized`).

    Raises:
        QuantizationNotApplied: ``names`` is empty, or some of its layers are still floating point; the
            message names them, the method and the libraries that ran it.
    """
    if not names:
        raise QuantizationNotApplied(
            f"quant.method: {method}: the model has no layer to quantize, so a quantized evaluation would score "
            "the float model"
        )
    left = [name for name in names if not is_quantized(model.get_submodule(name))]
    if left:
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        raise QuantizationNotApplied(
            f"quant.method: {method}: {len(left)} of the {len(names)} layers it quantizes were left in floating "
            f"point ({shown}) on {_backends()}; the quantized model would be scored, sized and timed as the float one"
        )
    return model


def _torchao() -> ModuleType:
    """``torchao.quantization``, imported late and quietly (it logs a note for each kernel library this
    machine cannot load, and torch a deprecation note on one of its enums)."""
    import importlib
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)
    pytree = logging.getLogger("torch.utils._pytree")
    level = pytree.level
    pytree.setLevel(logging.ERROR)
    try:
        return importlib.import_module("torchao.quantization")
    finally:
        pytree.setLevel(level)


def targets(model: nn.Module) -> dict[str, nn.Linear]:
    """The layers quantization applies to: every ``nn.Linear`` of ``model.encoder``, by name."""
    encoder = model.get_submodule("encoder")
    return {f"encoder.{name}": m for name, m in encoder.named_modules() if type(m) is nn.Linear}


def uniform_plan(model: nn.Module, bits: int) -> LayerBits:
    """Every target layer at ``bits``."""
    return dict.fromkeys(targets(model), bits)


def embedding_tables(model: nn.Module) -> dict[str, nn.Embedding]:
    """The encoder's looked-up embedding tables (word, token type), by name. The position table
    stays in floating point: the encoder adds a slice of it, not a lookup (512 x H: 0.4 % of
    bert-base)."""
    encoder = model.get_submodule("encoder")
    position = encoder.get_submodule("embeddings").position
    return {
        f"encoder.{name}": m for name, m in encoder.named_modules() if isinstance(m, nn.Embedding) and m is not position
    }


def check_quantizable(model: nn.Module, q: QuantConfig, what: str) -> None:
    """Before a run exists: a model whose ``quant`` quantizes something has layers it quantizes
    (ConfigError naming ``quant.method``, else the run would fail once its model is trained)."""
    if not q.enabled:
        return
    names = [
        *(targets(model) if q.method != "none" else ()),
        *(embedding_tables(model) if q.embeddings != "none" else ()),
    ]
    if not names:
        raise ConfigError(f"quant.method: {q.method}: {what} has no layer it quantizes")


def _weight_groups(model: nn.Module, plan: LayerBits, group_size: int) -> list[tuple[set[str], AOBaseConfig]]:
    """``plan``'s layers as (names, torchao ``IntxWeightOnlyConfig``) groups: one per bit width and
    granularity, group-wise where ``group_size`` divides the layer's input width, one scale per row
    where it does not (a pruned layer)."""
    q = _torchao()
    from torchao.quantization.granularity import PerAxis, PerGroup

    widths = {name: cast(nn.Linear, model.get_submodule(name)).in_features for name in plan}
    groups = []
    for bits in sorted(set(plan.values())):
        for grouped in (True, False):
            names = {n for n, b in plan.items() if b == bits and (widths[n] % group_size == 0) == grouped}
            granularity = PerGroup(group_size) if grouped else PerAxis(0)
            if names:
                groups.append(
                    (names, q.IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=granularity))
                )
    return groups


def _embedding_group(model: nn.Module, kind: str) -> list[tuple[set[str], AOBaseConfig]]:
    """The embedding tables as one (names, config) group at ``quant.embeddings``'s bits, one scale per
    row (a row is one token's vector); none for ``none``."""
    if kind not in EMBEDDING_BITS:
        return []
    from torchao.quantization.granularity import PerAxis

    dtype = getattr(torch, f"int{EMBEDDING_BITS[kind]}")
    return [(set(embedding_tables(model)), _torchao().IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerAxis(0)))]


def _apply(model: nn.Module, groups: list[tuple[set[str], AOBaseConfig]], step: str | None = None) -> nn.Module:
    """torchao's ``quantize_`` of each group's config on its modules (in place); ``step`` wraps the
    config in a ``QATConfig`` (``prepare``: fake-quantized modules; ``convert``: back, quantized)."""
    q = _torchao()
    from torchao.quantization.qat import QATConfig

    for names, config in groups:
        applied = config if step is None else QATConfig(config, step=step)
        q.quantize_(model, applied, filter_fn=lambda m, fqn, names=names: fqn in names)
    return model


def quantize_weights(model: nn.Module, plan: LayerBits, group_size: int) -> nn.Module:
    """Weight-only, group-wise quantization of the layers ``plan`` names, each at its bits (in place);
    a layer whose input width ``group_size`` does not divide (a pruned one) gets one scale per row."""
    return _apply(model, _weight_groups(model, plan, group_size))


def quantize_embeddings(model: nn.Module, kind: str) -> nn.Module:
    """The encoder's embedding tables at ``kind``'s bits (``int8``, ``int4``), one scale per row, in place;
    the MLM decoder tied to the word table reads the quantized table."""
    return _apply(model, _embedding_group(model, kind))


def prepare_weight_qat(model: nn.Module, plan: LayerBits, q: QuantConfig) -> nn.Module:
    """Quantization-aware training at 2-8 bits (Q-BERT): the layers ``plan`` names (and the embedding
    tables when ``quant.embeddings`` says) fake-quantized at their bits, group-wise, in place. The state
    dict keeps its names; :func:`convert_weight_qat` turns them into quantized layers."""
    return _apply(
        model, [*_weight_groups(model, plan, q.group_size), *_embedding_group(model, q.embeddings)], "prepare"
    )


def convert_weight_qat(model: nn.Module, plan: LayerBits, q: QuantConfig) -> nn.Module:
    """A :func:`prepare_weight_qat` model quantized as it trained (in place, eval mode, on the CPU)."""
    model = model.cpu().eval()
    groups = [*_weight_groups(model, plan, q.group_size), *_embedding_group(model, q.embeddings)]
    names = sorted({name for group, _ in groups for name in group})
    return check_quantized(_apply(model, groups, "convert"), names, f"{q.method} (quantization-aware)")


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """torch.ao dynamic int8 (per-channel weights) of the target layers; a new model."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = dict.fromkeys(targets(model), per_channel_dynamic_qconfig)
    with _quiet():
        return cast(nn.Module, quantize_dynamic(model, spec, dtype=torch.qint8))  # type: ignore[no-untyped-call]


def _qat_config(step: str) -> AOBaseConfig:  # a torchao QATConfig
    q = _torchao()
    from torchao.quantization.granularity import PerAxis
    from torchao.quantization.qat import QATConfig

    base = q.Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    return QATConfig(base, step=step)


def prepare_qat(model: nn.Module) -> nn.Module:
    """Fake-quantize the target layers for quantization-aware training (in place; the state dict keeps
    its names, so checkpoints and ``model/`` artifacts load into an unprepared model)."""
    names = set(targets(model))
    _torchao().quantize_(model, _qat_config("prepare"), filter_fn=lambda m, fqn: fqn in names)
    return model


def fake_quantized(model: nn.Module) -> list[str]:
    """The names of a :func:`prepare_qat` model's fake-quantized layers (none in a float model)."""
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    return [name for name, m in model.named_modules() if isinstance(m, FakeQuantizedLinear)]


def convert_qat(model: nn.Module) -> nn.Module:
    """Turn a :func:`prepare_qat` model's fake-quantized layers into int8 ones (in place)."""
    names = set(fake_quantized(model))
    _torchao().quantize_(model, _qat_config("convert"), filter_fn=lambda m, fqn: fqn in names)
    return model


def _to_quantize(model: nn.Module, q: QuantConfig, plan: LayerBits | None) -> list[str]:
    """The names of the layers :func:`quantize` quantizes in ``model`` as ``q`` says."""
    if q.method == "qat-int8":
        names = fake_quantized(model)
    elif q.method == "weight-mixed":
        names = list(plan or {})
    elif q.method in WEIGHT_BITS or q.method == "dynamic-int8":
        names = list(targets(model))
    else:
        names = []
    return names + (list(embedding_tables(model)) if q.embeddings in EMBEDDING_BITS else [])


def quantize(model: nn.Module, q: QuantConfig, plan: LayerBits | None = None) -> nn.Module:
    """``model`` (float, or prepared for QAT) quantized as ``q`` says, in eval mode on the CPU.

    ``plan`` is ``weight-mixed``'s bits per layer
    (:func:`ablate.lightning_modules.methods.quantization.mixed.mixed_plan`).
    The model is changed in place except by ``dynamic-int8``, which returns a new one. A float model
    under ``qat-int8`` is prepared first: the int8 layers its training would end with, untrained.

    Raises:
        QuantizationNotApplied: a layer it was to quantize is still floating point (:func:`check_quantized`).
    """
    model = model.cpu().eval()
    if q.method == "qat-int8" and not fake_quantized(model):
        model = prepare_qat(model)
    names = _to_quantize(model, q, plan)
    if q.method == "dynamic-int8":
        model = quantize_dynamic_int8(model)
    elif q.method == "qat-int8":
        model = convert_qat(model)
    elif q.method == "weight-mixed":
        if plan is None:
            raise ValueError("weight-mixed needs a plan of bits per layer (mixed_plan)")
        model = quantize_weights(model, plan, q.group_size)
    elif q.method in WEIGHT_BITS:
        model = quantize_weights(model, uniform_plan(model, WEIGHT_BITS[q.method]), q.group_size)
    model = quantize_embeddings(model, q.embeddings)  # last: dynamic-int8 copies the model
    return check_quantized(model, names, q.method)


def quantized_like(model: nn.Module, q: QuantConfig) -> nn.Module:
    """``model`` (float, random weights will do) quantized the way a run with ``q`` ends, to time it:
    ``qat-int8`` as its converted layers; ``weight-mixed`` at ``low_bits`` everywhere, which runs the
    same kernels as its plan (torchao keeps every width unpacked in int8 and dequantizes it)."""
    if q.method == "weight-mixed":
        return quantize(model, q, uniform_plan(model, q.low_bits))
    return quantize(model, q)  # qat-int8: prepared, then converted


def quantized_report(
    cfg: ModelConfig, objective: ObjectiveConfig | None = None, seq_len: int = 128, quant: QuantConfig | None = None
) -> ParamReport:
    """:func:`~ablate.lightning_modules.measure.accounting.report_for`, with a ``quant`` method built for real
    and quantized: the quantized model's ``model_bytes``.

    Raises:
        ConfigError: ``weight-mixed``, whose bits per layer follow from a trained model's sensitivity.
    """
    if quant is None or not quant.enabled:
        return report_for(cfg, objective, seq_len)
    if quant.method == "weight-mixed":
        raise ConfigError(
            "quant.method: weight-mixed gives bits by each layer's measured sensitivity, so its size is known "
            "only after a run (ablate train); ablate params sizes uniform methods"
        )
    model = build_pretraining_model(cfg, objective or ObjectiveConfig())
    report = param_report(model, cfg, seq_len)
    return replace(report, model_bytes=stored_bytes(quantize(model, quant)))
