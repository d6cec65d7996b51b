"""Activation memory of one training step (:func:`peak_train_memory`): on CUDA the allocator's
peak, elsewhere the storages autograd saves for backward (:func:`saved_activation_bytes`, which
``ablate bench train`` also uses on transformers' side)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ablate.lightning_modules.measure.measuring import autocast_for, forked_rng, placed, random_batch, sync
from ablate.lightning_modules.model.heads import PretrainingModel


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
            with forked_rng(dev):
                if dev.type == "cuda":
                    before = torch.cuda.memory_allocated(dev)  # allocation stats need no sync
                    torch.cuda.reset_peak_memory_stats(dev)
                    with autocast_for(precision, dev):
                        loss = model(b).loss
                    loss.backward()  # outside autocast, as Lightning runs backward
                    sync(dev)
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
