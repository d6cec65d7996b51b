"""Measured cost of a model (it runs the model; accounting.py counts without running it).

A run measures on the device it trains on (:func:`training_device` resolves ``trainer.accelerator``
as Lightning does) and under the autocast it trains with (``trainer.precision``), and logs where
(:func:`describe_device`). Inputs come from a private generator and every measurement runs under
:func:`torch.random.fork_rng` over the CPU generator and the measured CUDA device's: measuring
never shifts a seeded run's random streams.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass

import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from ablate.lightning_modules.heads import PretrainingModel

FIRST_ID = 5  # ids below are special tokens ([PAD], [CLS], ...): never drawn


@dataclass(frozen=True)
class Measured:
    """Measured cost of one model on one device.

    Attributes:
        latency_ms_b1: median encoder forward latency at batch 1, milliseconds.
        latency_ms_b32: median encoder forward latency at batch 32, milliseconds.
        train_activation_mb: activation memory of one training step, MiB (2**20 bytes).
        device: where it was measured (:func:`describe_device`), e.g. ``"cpu (16 threads)"`` or
            ``"cuda:0 (NVIDIA H100 80GB HBM3)"``.
    """

    latency_ms_b1: float
    latency_ms_b32: float
    train_activation_mb: float
    device: str

    def as_dict(self) -> dict[str, float | str]:
        """The fields as a plain dict (JSON / MLflow ready)."""
        return asdict(self)


def training_device(accelerator: str) -> torch.device:
    """The device a run with ``trainer.accelerator`` = ``accelerator`` trains on (rank 0's), resolved
    as Lightning resolves it: ``auto`` = MPS or CUDA when available, else the CPU; ``gpu`` = MPS or
    CUDA (the CPU here when neither is: the Trainer then refuses it); ``cuda``, ``mps``, ``cpu`` as
    named. CUDA means ``cuda:0``, the first visible device (Lightning's ``devices=N`` takes
    ``0..N-1``). Asking does not initialise CUDA."""
    name = accelerator.lower()
    cuda = torch.cuda.is_available() and name in ("auto", "gpu", "cuda")
    mps = torch.backends.mps.is_available() and name in ("auto", "gpu", "mps")
    if mps:
        return torch.device("mps")
    return torch.device("cuda", 0) if cuda else torch.device("cpu")


def describe_device(device: torch.device | str) -> str:
    """Where a measurement ran, for the record: ``"cuda:0 (NVIDIA H100 80GB HBM3)"``,
    ``"cpu (16 threads)"`` (torch's intra-op threads), else the device's name."""
    dev = torch.device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if dev.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(dev)


def autocast_for(precision: str, device: torch.device) -> AbstractContextManager[None]:
    """The autocast a Lightning run with ``trainer.precision`` = ``precision`` runs its steps under
    on ``device``: Lightning's own :class:`MixedPrecision` context for ``bf16-mixed`` and
    ``16-mixed`` (``torch.autocast`` to bf16 / fp16, no cast cache), nothing for ``32-true``."""
    if precision in ("bf16-mixed", "16-mixed"):
        return MixedPrecision(precision, device=device.type).forward_context()  # type: ignore[arg-type]
    return nullcontext()


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device  # one device per model


def _forked_rng(device: torch.device) -> AbstractContextManager[None]:
    """Fork the CPU generator and, on CUDA, the measured device's generator (restored on exit)."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type="cuda")


@contextmanager
def placed(model: torch.nn.Module, device: torch.device | None, train: bool) -> Iterator[torch.device]:
    """Run with ``model`` on ``device`` in train or eval mode, uncompiled (a module's
    :meth:`~torch.nn.Module.compile` is bypassed: measuring compiles nothing); restore device,
    per-module modes and compiled calls after."""
    home = _model_device(model)
    dev = torch.device(device) if device is not None else home
    modes = [(m, m.training) for m in model.modules()]
    compiled = [(m, m._compiled_call_impl) for m in model.modules() if m._compiled_call_impl is not None]
    try:
        for m, _ in compiled:
            m._compiled_call_impl = None
        model.to(dev).train(train)
        yield dev
    finally:
        model.to(home)
        for m, mode in modes:
            m.training = mode
        for m, call in compiled:
            m._compiled_call_impl = call


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_batch(
    vocab_size: int, batch: int, seq_len: int, device: torch.device, mask_prob: float = 0.15, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A pre-training batch of random ids in ``[5, vocab_size)``, no padding.

    Returns:
        ``input_ids``, ``token_type_ids`` (B, T) long; ``attention_mask`` (B, T) bool;
        ``mlm_labels`` (B, T) long, -100 except about ``mask_prob`` of positions (at least one);
        ``sentence_label`` (B,) long.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_ID, vocab_size, (batch, seq_len), generator=g)
    types = (torch.arange(seq_len) >= seq_len // 2).long().expand(batch, seq_len).contiguous()  # A | B halves
    selected = torch.rand(batch, seq_len, generator=g) < mask_prob
    selected[:, min(1, seq_len - 1)] = True  # never an empty MLM loss
    out = {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": torch.ones(batch, seq_len, dtype=torch.bool),
        "mlm_labels": torch.where(selected, ids, torch.full_like(ids, -100)),
        "sentence_label": torch.randint(0, 2, (batch,), generator=g),
    }
    return {k: v.to(device) for k, v in out.items()}


def measure_latency(
    model: PretrainingModel,
    vocab_size: int,
    batch: int,
    seq_len: int = 128,
    repeats: int = 10,
    warmup: int = 2,
    device: torch.device | None = None,
    precision: str = "32-true",
) -> float:
    """Forward-only latency of ``model.encoder`` in milliseconds (median of ``repeats`` runs).

    Runs eager (uncompiled) in eval mode under :func:`torch.inference_mode` and the autocast of
    ``precision`` (:func:`autocast_for`: a ``bf16-mixed`` run's encoder runs its matmuls in bf16)
    after ``warmup`` untimed runs, timed with :func:`time.perf_counter` (CUDA synchronized before
    and after each run, so the time is the device's, not the launch's).

    Args:
        model: the pre-training model; only its encoder runs (heads are not timed).
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        batch: batch size B.
        seq_len: sequence length T.
        repeats: timed runs.
        warmup: untimed runs first.
        device: where to run; ``None`` = where the model is. The model is moved back afterwards.
        precision: the Lightning precision to run under (``32-true``, ``bf16-mixed``, ``16-mixed``).

    Returns:
        The median wall time of one forward, ms. Model device and training modes are restored.
    """
    with (
        placed(model, device, train=False) as dev,
        _forked_rng(dev),
        torch.inference_mode(),
        autocast_for(precision, dev),
    ):
        b = random_batch(vocab_size, batch, seq_len, dev)
        args = (b["input_ids"], b["token_type_ids"], b["attention_mask"])
        for _ in range(warmup):
            model.encoder(*args)
        times = []
        for _ in range(repeats):
            _sync(dev)
            start = time.perf_counter()
            model.encoder(*args)
            _sync(dev)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def peak_train_memory(
    model: PretrainingModel,
    vocab_size: int,
    batch: int,
    seq_len: int,
    mask_prob: float = 0.15,
    device: torch.device | None = None,
    precision: str = "32-true",
) -> int:
    """Activation memory in bytes of one training step (forward + backward of the full loss), eager
    (uncompiled) and under the autocast of ``precision`` (in ``bf16-mixed`` activations are mostly
    bf16; the bf16 copies of the weights that autocast makes for the step count too).

    Method per device:

    - CUDA: ``torch.cuda.max_memory_allocated`` during the step minus the memory allocated
      before it (parameters, their gradients if any, the batch). This also counts backward
      temporaries and the parameter gradients created by backward.
    - CPU (and any other device): a :func:`torch.autograd.graph.saved_tensors_hooks` pack hook
      sums the bytes of the unique storages autograd saves for backward during the forward
      (deduplicated by storage ``data_ptr``; parameters, buffers and the batch excluded). That
      is exactly the activation memory training keeps, dropout masks included; allocator
      overhead and short-lived temporaries are not counted.

    Runs in train mode under :func:`torch.random.fork_rng` over the CPU generator and, on CUDA,
    the device's (dropout does not shift the global random streams). Gradients are zeroed (set to
    ``None``) afterwards; no optimizer step.

    Args:
        model: the pre-training model; ``model(batch)`` returns an object with ``.loss``.
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        batch: batch size B.
        seq_len: sequence length T.
        mask_prob: share of positions with an MLM label.
        device: where to run; ``None`` = where the model is. The model is moved back afterwards.
        precision: the Lightning precision to run under (``32-true``, ``bf16-mixed``, ``16-mixed``).

    Returns:
        Activation bytes.
    """
    with placed(model, device, train=True) as dev:
        b = random_batch(vocab_size, batch, seq_len, dev, mask_prob)
        try:
            with _forked_rng(dev):
                if dev.type == "cuda":
                    before = torch.cuda.memory_allocated(dev)  # allocation stats need no sync
                    torch.cuda.reset_peak_memory_stats(dev)
                    with autocast_for(precision, dev):
                        loss = model(b).loss
                    loss.backward()  # outside autocast, as Lightning runs backward
                    _sync(dev)
                    return torch.cuda.max_memory_allocated(dev) - before
                return saved_activation_bytes(
                    lambda: _autocast_loss(model, b, precision, dev),
                    [*model.parameters(), *model.buffers(), *b.values()],
                )
        finally:
            model.zero_grad(set_to_none=True)


def _autocast_loss(
    model: PretrainingModel, batch: dict[str, torch.Tensor], precision: str, device: torch.device
) -> torch.Tensor:
    with autocast_for(precision, device):
        loss: torch.Tensor = model(batch).loss
        return loss


def saved_activation_bytes(loss: Callable[[], torch.Tensor], held: Iterable[torch.Tensor]) -> int:
    """Bytes of the unique storages autograd saves for backward while ``loss()`` runs (storages
    of ``held`` — parameters, buffers, the batch — excluded), then runs backward."""
    exclude = {t.untyped_storage().data_ptr() for t in held}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        value = loss()
    value.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
    return sum(saved.values())


def measure(
    model: PretrainingModel,
    vocab_size: int,
    seq_len: int = 128,
    device: torch.device | None = None,
    repeats: int = 10,
    warmup: int = 2,
    memory_batch: int = 32,
    precision: str = "32-true",
) -> Measured:
    """Latency at batch 1 and 32 and training activation memory at ``memory_batch``, on ``device``
    and under the autocast of ``precision``.

    What is measured: the eager (uncompiled) model; latency = ``model.encoder``'s forward in eval
    mode under inference mode (:func:`measure_latency`); memory = one training step's activations,
    forward and backward of the full loss (:func:`peak_train_memory`: on CUDA the allocator's peak,
    elsewhere the tensors autograd saves). A ``bf16-mixed`` (``16-mixed``) precision runs both under
    Lightning's autocast to bf16 (fp16), as its training steps run.

    Args:
        model: the pre-training model (left unchanged: device, modes, compiled call, no gradients).
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        seq_len: sequence length T of every measurement.
        device: where to run; ``None`` = where the model is (a run's: :func:`training_device`).
        repeats: timed runs per latency.
        warmup: untimed runs before each latency.
        memory_batch: batch size of the memory measurement.
        precision: the Lightning precision to run under (``32-true``, ``bf16-mixed``, ``16-mixed``).

    Returns:
        The :class:`Measured` costs, ``device`` described by :func:`describe_device`.
    """
    dev = torch.device(device) if device is not None else _model_device(model)
    with _forked_rng(dev):
        b1 = measure_latency(model, vocab_size, 1, seq_len, repeats, warmup, dev, precision)
        b32 = measure_latency(model, vocab_size, 32, seq_len, repeats, warmup, dev, precision)
        mem = peak_train_memory(model, vocab_size, memory_batch, seq_len, device=dev, precision=precision)
    return Measured(latency_ms_b1=b1, latency_ms_b32=b32, train_activation_mb=mem / 2**20, device=describe_device(dev))
