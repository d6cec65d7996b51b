"""Measured cost of a model (it runs the model; accounting.py counts without running it): its latency
here, its activation memory in :mod:`.memory`, both by :func:`measure`, on the run's device, under its
autocast, never shifting its random streams. A latency is the fastest timed repeat, with its spread and
the reference workload's median beside it (docs/accounting.md, "Measured latency and memory")."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch

from ablate.lightning_modules.measure.measuring import (
    autocast_for,
    describe_device,
    forked_rng,
    model_device,
    placed,
    random_batch,
    sync,
)
from ablate.lightning_modules.measure.memory import peak_train_memory
from ablate.lightning_modules.measure.reference_load import REFERENCE_SUFFIX, Workload, reference_workload
from ablate.lightning_modules.model.heads import PretrainingModel

LATENCY_BATCHES = (1, 32)  # the batch sizes every run times: metrics latency_ms_b1, latency_ms_b32
SPREAD_SUFFIX = "_spread"  # latency_ms_b1_spread = (median - min) / min of latency_ms_b1's repeats
REPEATS = 10  # timed repeats per latency (default)
WARMUP = 2  # untimed runs before them (default)


def latency_metric(batch: int) -> str:
    """The metric name of the latency at batch size ``batch``: ``latency_ms_b32``."""
    return f"latency_ms_b{batch}"


@dataclass(frozen=True)
class Measured:
    """Measured cost of one model on one device.

    Attributes:
        latency_ms_b1: encoder forward latency at batch 1, milliseconds: the minimum of the timed
            repeats (the least disturbed one, :func:`time_forward`).
        latency_ms_b32: the same at batch 32.
        train_activation_mb: activation memory of one training step, MiB (2**20 bytes).
        device: where it was measured (:func:`describe_device`), e.g. ``"cpu (16 threads)"`` or
            ``"cuda:0 (NVIDIA H100 80GB HBM3)"``.
        latency_ms_b1_spread: ``(median - min) / min`` of the batch-1 repeats (0.05 = the median
            repeat was 5 % slower than the fastest); large when the machine was busy.
        latency_ms_b32_spread: the same at batch 32.
        latency_ms_b1_reference: ms of the fixed reference workload timed after each batch-1 repeat
            (:mod:`~ablate.lightning_modules.measure.reference_load`), the median; NaN if not timed.
        latency_ms_b32_reference: the same beside the batch-32 repeats.
    """

    latency_ms_b1: float
    latency_ms_b32: float
    train_activation_mb: float
    device: str
    latency_ms_b1_spread: float = 0.0
    latency_ms_b32_spread: float = 0.0
    latency_ms_b1_reference: float = math.nan
    latency_ms_b32_reference: float = math.nan

    def as_dict(self) -> dict[str, float | str]:
        """The fields as a plain dict (JSON / MLflow ready)."""
        return asdict(self)


@dataclass(frozen=True)
class Latency:
    """The timed repeats of one forward (:func:`time_forward`).

    Attributes:
        times_ms: wall time of each timed repeat, milliseconds, in order.
        reference_ms: wall time of the reference workload run after each repeat (empty if none ran).
    """

    times_ms: tuple[float, ...]
    reference_ms: tuple[float, ...] = ()

    @property
    def min_ms(self) -> float:
        """The fastest repeat: the latency (a busy machine only adds time)."""
        return min(self.times_ms)

    @property
    def median_ms(self) -> float:
        """The median repeat."""
        return statistics.median(self.times_ms)

    @property
    def spread(self) -> float:
        """``(median - min) / min``: 0 when the repeats agree; 0.25 = the median repeat was 25 %
        slower than the fastest (something else was running)."""
        low = self.min_ms
        return (self.median_ms - low) / low if low > 0 else 0.0

    @property
    def reference_median_ms(self) -> float:
        """The median run of the reference workload beside the repeats; NaN if none ran."""
        return statistics.median(self.reference_ms) if self.reference_ms else math.nan


def time_forward(
    model: PretrainingModel,
    vocab_size: int,
    batch: int,
    seq_len: int = 128,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    device: torch.device | None = None,
    precision: str = "32-true",
    reference: Workload | None = None,
) -> Latency:
    """Time ``model.encoder``'s forward: ``warmup`` untimed runs, then ``repeats`` timed ones, each
    followed by one timed run of ``reference`` (if given) in the same window.

    Runs eager (uncompiled) in eval mode under :func:`torch.inference_mode` and the autocast of
    ``precision`` (:func:`autocast_for`: a ``bf16-mixed`` run's encoder runs its matmuls in bf16),
    each repeat timed with :func:`time.perf_counter` (CUDA synchronized before and after each run,
    so the time is the device's, not the launch's). Nothing else runs in between.

    Args:
        model: the pre-training model; only its encoder runs (heads are not timed).
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        batch: batch size B.
        seq_len: sequence length T.
        repeats: timed runs (at least 1).
        warmup: untimed runs first.
        device: where to run; ``None`` = where the model is. The model is moved back afterwards.
        precision: the Lightning precision to run under (``32-true``, ``bf16-mixed``, ``16-mixed``).
        reference: a fixed workload on ``device`` (:func:`~ablate.lightning_modules.measure.reference_load.
            reference_workload`), timed after each repeat; None times none.

    Returns:
        The repeats' wall times (:class:`Latency`: ``min_ms`` is the latency, ``spread`` how much
        the repeats disagree, ``reference_ms`` the reference's). Model device and training modes are restored.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    with (
        placed(model, device, train=False) as dev,
        forked_rng(dev),
        torch.inference_mode(),
        autocast_for(precision, dev),
    ):
        b = random_batch(vocab_size, batch, seq_len, dev)
        args = (b["input_ids"], b["token_type_ids"], b["attention_mask"])
        for _ in range(warmup):
            model.encoder(*args)
        times, refs = [], []
        for _ in range(repeats):
            sync(dev)
            start = time.perf_counter()
            model.encoder(*args)
            sync(dev)
            times.append((time.perf_counter() - start) * 1e3)
            if reference is not None:
                start = time.perf_counter()
                reference()
                sync(dev)
                refs.append((time.perf_counter() - start) * 1e3)
    return Latency(tuple(times), tuple(refs))


def measure_latency(
    model: PretrainingModel,
    vocab_size: int,
    batch: int,
    seq_len: int = 128,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    device: torch.device | None = None,
    precision: str = "32-true",
) -> float:
    """Forward-only latency of ``model.encoder`` in milliseconds: the minimum of ``repeats`` timed
    runs after ``warmup`` untimed ones (:func:`time_forward`, which also gives the spread).

    Returns:
        The fastest wall time of one forward, ms. Model device and training modes are restored.
    """
    return time_forward(model, vocab_size, batch, seq_len, repeats, warmup, device, precision).min_ms


def measure_latencies(
    model: PretrainingModel,
    vocab_size: int,
    seq_len: int = 128,
    device: torch.device | None = None,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    precision: str = "32-true",
    reference: Workload | None = None,
) -> dict[str, float]:
    """The latency metrics of a model, one dedicated pass per batch size of :data:`LATENCY_BATCHES`
    (:func:`time_forward`): ``latency_ms_b1`` (the minimum of the repeats, ms),
    ``latency_ms_b1_spread`` (``(median - min) / min``), ``latency_ms_b1_reference`` (the median
    run of the reference workload beside them: ``reference``, by default
    :func:`~ablate.lightning_modules.measure.reference_load.reference_workload` on the device), and the
    same three for batch 32.

    A run logs these before training (:func:`measure`); ``ablate report --remeasure`` times the
    models of a report the same way (:func:`time_forward`, :func:`latency_metrics`), in rounds.
    """
    dev = torch.device(device) if device is not None else model_device(model)
    timed: dict[int, Latency] = {}
    with forked_rng(dev):
        ref = reference if reference is not None else reference_workload(dev)
        for batch in LATENCY_BATCHES:  # one dedicated pass each, nothing in between
            timed[batch] = time_forward(model, vocab_size, batch, seq_len, repeats, warmup, dev, precision, ref)
    return latency_metrics(timed)


def latency_metrics(timed: Mapping[int, Latency]) -> dict[str, float]:
    """Metrics of timed forwards by batch size: ``latency_ms_b<B>`` (the fastest repeat, ms),
    ``latency_ms_b<B>_spread`` (``(median - min) / min``) and, where a reference workload ran
    beside them, ``latency_ms_b<B>_reference`` (its median run, ms)."""
    out: dict[str, float] = {}
    for batch, lat in timed.items():
        out[latency_metric(batch)] = lat.min_ms
        out[latency_metric(batch) + SPREAD_SUFFIX] = lat.spread
        if lat.reference_ms:
            out[latency_metric(batch) + REFERENCE_SUFFIX] = lat.reference_median_ms
    return out


def measure(
    model: PretrainingModel,
    vocab_size: int,
    seq_len: int = 128,
    device: torch.device | None = None,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    memory_batch: int = 32,
    precision: str = "32-true",
    reference: Workload | None = None,
) -> Measured:
    """Latency at batch 1 and 32 and training activation memory at ``memory_batch``, on ``device``
    and under the autocast of ``precision``.

    What is measured: the eager (uncompiled) model; latency = ``model.encoder``'s forward in eval
    mode under inference mode, the minimum of ``repeats`` timed runs after ``warmup`` untimed ones,
    with its spread ``(median - min) / min`` (:func:`measure_latencies`); memory = one training step's activations,
    forward and backward of the full loss (:func:`peak_train_memory`: on CUDA the allocator's peak,
    elsewhere the tensors autograd saves). A ``bf16-mixed`` (``16-mixed``) precision runs both under
    Lightning's autocast to bf16 (fp16), as its training steps run.

    Args:
        model: the pre-training model (left unchanged: device, modes, compiled call, no gradients).
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        seq_len: sequence length T of every measurement.
        device: where to run; ``None`` = where the model is (a run's: :func:`~.measuring.training_device`).
        repeats: timed runs per latency.
        warmup: untimed runs before each latency.
        memory_batch: batch size of the memory measurement.
        precision: the Lightning precision to run under (``32-true``, ``bf16-mixed``, ``16-mixed``).
        reference: the workload timed beside the latency repeats (default: :func:`~ablate.
            lightning_modules.measure.reference_load.reference_workload` on the device).

    Returns:
        The :class:`Measured` costs, ``device`` described by :func:`describe_device`.
    """
    dev = torch.device(device) if device is not None else model_device(model)
    with forked_rng(dev):
        lat = measure_latencies(model, vocab_size, seq_len, dev, repeats, warmup, precision, reference)  # first
        mem = peak_train_memory(model, vocab_size, memory_batch, seq_len, device=dev, precision=precision)
    return Measured(
        latency_ms_b1=lat["latency_ms_b1"],
        latency_ms_b32=lat["latency_ms_b32"],
        train_activation_mb=mem / 2**20,
        device=describe_device(dev),
        latency_ms_b1_spread=lat["latency_ms_b1_spread"],
        latency_ms_b32_spread=lat["latency_ms_b32_spread"],
        latency_ms_b1_reference=lat["latency_ms_b1_reference"],
        latency_ms_b32_reference=lat["latency_ms_b32_reference"],
    )
