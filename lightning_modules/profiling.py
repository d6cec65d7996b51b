"""Measured cost of a model (it runs the model; accounting.py counts without running it).

Inputs come from a private generator and the training step runs under
:func:`torch.random.fork_rng`: measuring never shifts a seeded run's random stream.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from collections.abc import Callable, Iterable, Iterator

import torch

from lightning_modules.heads import PretrainingModel

FIRST_ID = 5  # ids below are special tokens ([PAD], [CLS], ...): never drawn


@dataclass(frozen=True)
class Measured:
    """Measured cost of one model on one device.

    Attributes:
        latency_ms_b1: median encoder forward latency at batch 1, milliseconds.
        latency_ms_b32: median encoder forward latency at batch 32, milliseconds.
        train_activation_mb: activation memory of one training step, MiB (2**20 bytes).
        device: where it was measured, e.g. ``"cpu"`` or ``"cuda"``.
    """

    latency_ms_b1: float
    latency_ms_b32: float
    train_activation_mb: float
    device: str

    def as_dict(self) -> dict[str, float | str]:
        """The fields as a plain dict (JSON / MLflow ready)."""
        return asdict(self)


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device  # one device per model


@contextmanager
def _placed(model: torch.nn.Module, device: torch.device | None, train: bool) -> Iterator[torch.device]:
    """Run with ``model`` on ``device`` in train or eval mode; restore device and per-module modes after."""
    home = _model_device(model)
    dev = torch.device(device) if device is not None else home
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.to(dev).train(train)
        yield dev
    finally:
        model.to(home)
        for m, mode in modes:
            m.training = mode


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_batch(vocab_size: int, batch: int, seq_len: int, device: torch.device, mask_prob: float = 0.15,
                 seed: int = 0) -> dict[str, torch.Tensor]:
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
    out = {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones(batch, seq_len, dtype=torch.bool),
           "mlm_labels": torch.where(selected, ids, torch.full_like(ids, -100)),
           "sentence_label": torch.randint(0, 2, (batch,), generator=g)}
    return {k: v.to(device) for k, v in out.items()}


def measure_latency(model: PretrainingModel, vocab_size: int, batch: int, seq_len: int = 128, repeats: int = 10,
                    warmup: int = 2, device: torch.device | None = None) -> float:
    """Forward-only latency of ``model.encoder`` in milliseconds (median of ``repeats`` runs).

    Runs in eval mode under :func:`torch.inference_mode` after ``warmup`` untimed runs, timed
    with :func:`time.perf_counter` (CUDA synchronized before and after each run).

    Args:
        model: the pre-training model; only its encoder runs (heads are not timed).
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        batch: batch size B.
        seq_len: sequence length T.
        repeats: timed runs.
        warmup: untimed runs first.
        device: where to run; ``None`` = where the model is. The model is moved back afterwards.

    Returns:
        The median wall time of one forward, ms. Model device and training modes are restored.
    """
    with _placed(model, device, train=False) as dev, torch.inference_mode():
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


def peak_train_memory(model: PretrainingModel, vocab_size: int, batch: int, seq_len: int, mask_prob: float = 0.15,
                      device: torch.device | None = None) -> int:
    """Activation memory in bytes of one training step (forward + backward of the full loss).

    Method per device:

    - CUDA: ``torch.cuda.max_memory_allocated`` during the step minus the memory allocated
      before it (parameters, their gradients if any, the batch). This also counts backward
      temporaries and the parameter gradients created by backward.
    - CPU (and any other device): a :func:`torch.autograd.graph.saved_tensors_hooks` pack hook
      sums the bytes of the unique storages autograd saves for backward during the forward
      (deduplicated by storage ``data_ptr``; parameters, buffers and the batch excluded). That
      is exactly the activation memory training keeps, dropout masks included; allocator
      overhead and short-lived temporaries are not counted.

    Runs in train mode under :func:`torch.random.fork_rng` (dropout does not shift the global
    random stream). Gradients are zeroed (set to ``None``) afterwards; no optimizer step.

    Args:
        model: the pre-training model; ``model(batch)`` returns an object with ``.loss``.
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        batch: batch size B.
        seq_len: sequence length T.
        mask_prob: share of positions with an MLM label.
        device: where to run; ``None`` = where the model is. The model is moved back afterwards.

    Returns:
        Activation bytes.
    """
    with _placed(model, device, train=True) as dev:
        b = random_batch(vocab_size, batch, seq_len, dev, mask_prob)
        cuda = dev.type == "cuda"
        try:
            with torch.random.fork_rng(devices=[dev] if cuda else [], device_type=dev.type):
                if cuda:
                    before = torch.cuda.memory_allocated(dev)  # allocation stats need no sync
                    torch.cuda.reset_peak_memory_stats(dev)
                    model(b).loss.backward()
                    _sync(dev)
                    return torch.cuda.max_memory_allocated(dev) - before
                return saved_activation_bytes(lambda: model(b).loss,
                                              [*model.parameters(), *model.buffers(), *b.values()])
        finally:
            model.zero_grad(set_to_none=True)


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
    value.backward()
    return sum(saved.values())


def measure(model: PretrainingModel, vocab_size: int, seq_len: int = 128, device: torch.device | None = None,
            repeats: int = 10, warmup: int = 2, memory_batch: int = 32) -> Measured:
    """Latency at batch 1 and 32 and training activation memory at ``memory_batch``.

    Args:
        model: the pre-training model (left unchanged: device, modes, no gradients).
        vocab_size: ids are drawn from ``[5, vocab_size)``.
        seq_len: sequence length T of every measurement.
        device: where to run; ``None`` = where the model is.
        repeats: timed runs per latency.
        warmup: untimed runs before each latency.
        memory_batch: batch size of the memory measurement.

    Returns:
        The :class:`Measured` costs.
    """
    dev = torch.device(device) if device is not None else _model_device(model)
    b1 = measure_latency(model, vocab_size, 1, seq_len, repeats, warmup, dev)
    b32 = measure_latency(model, vocab_size, 32, seq_len, repeats, warmup, dev)
    mem = peak_train_memory(model, vocab_size, memory_batch, seq_len, device=dev)
    return Measured(latency_ms_b1=b1, latency_ms_b32=b32, train_activation_mb=mem / 2**20, device=dev.type)
