"""How a measurement runs a model: on which device (:func:`training_device`), described how
(:func:`describe_device`, :func:`describe_machine`), in which mode and uncompiled (:func:`placed`),
under its training's autocast (:func:`autocast_for`), on which inputs (:func:`random_batch`), and
without shifting a seeded run's random streams (:func:`forked_rng`); for :mod:`.profiling` and :mod:`.memory`."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

FIRST_ID = 5  # ids below are special tokens ([PAD], [CLS], ...): never drawn


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


def cpu_model() -> str:
    """The host's CPU model, e.g. ``"Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"``: the first
    ``model name`` of ``/proc/cpuinfo`` (Linux), else :func:`platform.processor` or the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_machine(device: torch.device | str) -> str:
    """Which machine measured, for a report: the device (:func:`describe_device`) and the host's
    CPU model, e.g. ``"cpu (2 threads), Intel(R) Xeon(R) ..."`` or ``"cuda:0 (NVIDIA H100 80GB
    HBM3), host CPU AMD EPYC 9454"``."""
    dev = torch.device(device)
    host = cpu_model()
    return f"{describe_device(dev)}, {host}" if dev.type == "cpu" else f"{describe_device(dev)}, host CPU {host}"


def autocast_for(precision: str, device: torch.device) -> AbstractContextManager[None]:
    """The autocast a Lightning run with ``trainer.precision`` = ``precision`` runs its steps under
    on ``device``: Lightning's own :class:`MixedPrecision` context for ``bf16-mixed`` and
    ``16-mixed`` (``torch.autocast`` to bf16 / fp16, no cast cache), nothing for ``32-true``."""
    if precision in ("bf16-mixed", "16-mixed"):
        from lightning.pytorch.plugins.precision import MixedPrecision  # here: Lightning's import costs seconds

        return MixedPrecision(precision, device=device.type).forward_context()  # type: ignore[arg-type]
    return nullcontext()


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device  # one device per model


def forked_rng(device: torch.device) -> AbstractContextManager[None]:
    """Fork the CPU generator and, on CUDA, the measured device's generator (restored on exit)."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type="cuda")


@contextmanager
def placed(model: torch.nn.Module, device: torch.device | None, train: bool) -> Iterator[torch.device]:
    """Run with ``model`` on ``device`` in train or eval mode, uncompiled (a module's
    :meth:`~torch.nn.Module.compile` is bypassed: measuring compiles nothing); restore device,
    per-module modes and compiled calls after."""
    home = model_device(model)
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


def sync(device: torch.device) -> None:
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
