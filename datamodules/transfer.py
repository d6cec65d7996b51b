"""Batches from DataLoader workers to the training process as one buffer: :class:`PackedBatch` through
the worker's pipe instead of a shared-memory hand-over per tensor, viewed again as the original dict by
:func:`unpack` (``on_after_batch_transfer``); an endless stream's batches a few at a time
(:class:`GroupedLoader`); also the resumable shuffled loader of the fine-tuning tasks
(:func:`task_loader`). Why: docs/data.md, "The pre-training pipeline"."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ablate.datamodules.handover import direct_context

if TYPE_CHECKING:
    import lightning.pytorch as pl

Layout = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]
"""Each field of the batch: name, dtype, shape; in buffer order."""
Batch = Mapping[str, torch.Tensor]
"""A collated batch: tensors by name."""
T = TypeVar("T")  # what a collate function takes: the examples of a batch
B = TypeVar("B")

_ALIGN = 16  # every field starts at a multiple of this many bytes: a view of any dtype is allowed


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``, in elements."""
    strides, size = [], 1
    for dim in reversed(shape):
        strides.append(size)
        size *= dim
    return tuple(reversed(strides))


@dataclass(frozen=True)
class PackedBatch:
    """A dict of tensors as one contiguous ``uint8`` buffer and the layout to read it back."""

    buffer: torch.Tensor
    layout: Layout

    @classmethod
    def pack(cls, batch: Mapping[str, torch.Tensor]) -> PackedBatch:
        """Copy the tensors of ``batch`` into one buffer (in the worker)."""
        layout = tuple((name, t.dtype, tuple(t.shape)) for name, t in batch.items())
        sizes = [_padded(t.numel() * t.element_size()) for t in batch.values()]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8)
        offset = 0
        for t, size in zip(batch.values(), sizes, strict=True):
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
            buffer[offset : offset + raw.numel()] = raw
            offset += size
        return cls(buffer, layout)

    def unpack(self) -> dict[str, torch.Tensor]:
        """The original dict, as views into the buffer (on whatever device it is): one view of the buffer
        per dtype, then one strided view per field (each a host-side tensor operation, every step)."""
        out, offset = {}, 0
        typed: dict[torch.dtype, torch.Tensor] = {}
        for name, dtype, shape in self.layout:
            nbytes = math.prod(shape) * dtype.itemsize
            whole = typed.get(dtype)
            if whole is None:
                whole = typed[dtype] = self.buffer.view(dtype)  # every field starts at a multiple of _ALIGN bytes
            out[name] = whole.as_strided(shape, _contiguous(shape), whole.storage_offset() + offset // dtype.itemsize)
            offset += _padded(nbytes)
        return out

    def pin_memory(self) -> PackedBatch:
        """Page-locked copy (the DataLoader's pin-memory thread calls this)."""
        return PackedBatch(self.buffer.pin_memory(), self.layout)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """One copy to ``device`` (Lightning's batch transfer calls this)."""
        return PackedBatch(self.buffer.to(device, non_blocking=non_blocking), self.layout)

    def __reduce__(self) -> tuple[Callable[[bytes, Layout], PackedBatch], tuple[bytes, Layout]]:
        # By value through the worker's pipe: shared memory would cost a descriptor per batch.
        return _from_bytes, (self.buffer.numpy().tobytes(), self.layout)


def _from_bytes(data: bytes, layout: Layout) -> PackedBatch:
    return PackedBatch(torch.frombuffer(bytearray(data), dtype=torch.uint8), layout)


Part = tuple[int, int, Layout]
"""One batch of a :class:`PackedGroup`: its first byte in the buffer, its bytes, its layout."""


@dataclass(frozen=True)
class PackedGroup:
    """Consecutive batches of one worker as one buffer (one message through its pipe)."""

    buffer: torch.Tensor
    parts: tuple[Part, ...]

    @classmethod
    def pack(cls, batches: Sequence[Mapping[str, torch.Tensor]]) -> PackedGroup:
        """Pack each batch and join the buffers (in the worker); each starts at a multiple of ``_ALIGN`` bytes."""
        packed = [PackedBatch.pack(b) for b in batches]
        starts = itertools.accumulate((p.buffer.numel() for p in packed), initial=0)
        parts = tuple((start, p.buffer.numel(), p.layout) for start, p in zip(starts, packed, strict=False))
        return cls(torch.cat([p.buffer for p in packed]), parts)

    def batches(self) -> list[PackedBatch]:
        """Each batch, its buffer a view into the group's."""
        return [PackedBatch(self.buffer[start : start + size], layout) for start, size, layout in self.parts]

    def pin_memory(self) -> PackedGroup:
        """Page-locked copy (the DataLoader's pin-memory thread calls this)."""
        return PackedGroup(self.buffer.pin_memory(), self.parts)

    def __reduce__(self) -> tuple[Callable[[bytes, tuple[Part, ...]], PackedGroup], tuple[bytes, tuple[Part, ...]]]:
        return _group_from_bytes, (self.buffer.numpy().tobytes(), self.parts)


def _group_from_bytes(data: bytes, parts: tuple[Part, ...]) -> PackedGroup:
    return PackedGroup(torch.frombuffer(bytearray(data), dtype=torch.uint8), parts)


GROUP = 4
"""Batches a worker of an endless stream hands over at a time (:class:`GroupedLoader`): a hand-over costs
the training process about a quarter of a millisecond of host time whatever its size (docs/performance.md)."""


class GroupedLoader(DataLoader[dict[str, torch.Tensor]]):
    """A ``DataLoader`` over an endless iterable dataset of whole batches whose workers hand them over
    ``batch_size`` at a time (``collate_fn`` :meth:`PackedGroup.pack`); it gives them back one at a time
    (:class:`PackedBatch`) in the stream's global order: worker ``w`` yields global batches ``w``, ``w + k``,
    ... of ``k`` workers, so a round of one group from each worker is interleaved, from worker
    ``first_worker`` on (the stream's skipped batches modulo ``k``: where a resumed fit goes on)."""

    def __init__(self, *args: object, first_worker: int = 0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # DataLoader's own arguments
        self.first_worker = first_worker

    def __iter__(self) -> Iterator[PackedBatch]:  # type: ignore[override]  # packed batches, unpacked later
        groups = cast(Iterator[PackedGroup], super().__iter__())
        workers = max(1, self.num_workers)
        first = self.first_worker % workers
        while round_ := [group.batches() for group in itertools.islice(groups, workers)]:
            round_ = round_[first:] + round_[:first]
            for i in range(max(len(batches) for batches in round_)):
                yield from (batches[i] for batches in round_ if i < len(batches))


@dataclass(frozen=True)
class _Packing(Generic[T]):
    collate: Callable[[T], Batch] | None

    def __call__(self, items: T) -> PackedBatch:
        return PackedBatch.pack(cast(Batch, items) if self.collate is None else self.collate(items))


def packed(collate: Callable[[T], Batch] | None, workers: int) -> Callable[[T], Batch | PackedBatch] | None:
    """The DataLoader's ``collate_fn``: ``collate`` (None: the dataset yields whole batches),
    packing its batches when ``workers`` worker processes hand them over; as it is otherwise."""
    return _Packing(collate) if workers > 0 else collate


def unpack(batch: PackedBatch | B) -> dict[str, torch.Tensor] | B:
    """``batch`` unpacked if it is a :class:`PackedBatch`, else unchanged."""
    return batch.unpack() if isinstance(batch, PackedBatch) else batch


class TrainPosition:
    """What a data module mixes in (before ``LightningDataModule``) so that a fit resumed from a checkpoint
    goes on with the batch the checkpointed fit would have trained next: the training batches consumed
    are saved in Lightning's checkpoints, and the next training loader skips them (once: a run's next
    phase starts its loader afresh, as it does in a run that was not interrupted)."""

    skip_train_batches = 0
    trainer: pl.Trainer | None

    def state_dict(self) -> dict[str, int]:
        """Saved in Lightning checkpoints: training batches consumed so far (``accumulate_grad_batches``
        per optimizer step)."""
        trainer = self.trainer
        if trainer is None:
            return {"train_batches": self.skip_train_batches}
        return {"train_batches": trainer.global_step * trainer.accumulate_grad_batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """On resume: the next training loader skips the batches the checkpointed fit consumed."""
        self.skip_train_batches = int(state.get("train_batches", 0))

    def take_skip(self) -> int:
        """The batches the next training loader skips (then none)."""
        skip, self.skip_train_batches = self.skip_train_batches, 0
        return skip

    def pinned(self) -> bool:
        """Whether the loaders hand batches over in page-locked memory: on a CUDA device, where Lightning's
        copy of a batch from pageable memory would make the host wait for the device's queue every step."""
        trainer = self.trainer
        return trainer is not None and trainer.strategy.root_device.type == "cuda"


class ResumedShuffle(Sampler[int]):
    """``RandomSampler(generator=generator)``: the same draws, the first ``skip`` samples of its first
    epoch left out (where a resumed fit goes on)."""

    def __init__(self, n: int, generator: torch.Generator, skip: int = 0) -> None:
        self.n, self.generator, self.skip = n, generator, skip

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        start, self.skip = self.skip, 0
        yield from torch.randperm(self.n, generator=self.generator).tolist()[start:]
        yield from torch.randperm(self.n, generator=self.generator).tolist()[:0]  # as RandomSampler's empty tail


def _shuffled(
    n: int, seed: int, batch_size: int, workers: int, skip_batches: int, per_epoch: int
) -> tuple[ResumedShuffle, torch.Generator]:
    """The sampler and loader generator of a shuffled loader (``per_epoch`` batches an epoch) that draws
    what ``DataLoader(shuffle=True, generator=seeded)`` draws, started ``skip_batches`` batches in: the
    epochs before are replayed (each epoch's iterator draws the loader's seed, persistent workers' only the
    first; the order draws twice)."""
    generator = torch.Generator().manual_seed(seed)
    epochs, within = divmod(skip_batches, per_epoch)
    for epoch in range(epochs):
        if workers == 0 or epoch == 0:
            torch.empty((), dtype=torch.int64).random_(generator=generator)
        torch.randperm(n, generator=generator)
        torch.randperm(n, generator=generator)
    # persistent workers drew their seed once, in the first epoch: this loader's own draw must not move the order
    loader = torch.Generator().manual_seed(seed) if epochs and workers > 0 else generator
    return ResumedShuffle(n, generator, within * batch_size), loader


def task_loader(
    split: Dataset[T],
    batch_size: int,
    collate: Callable[[list[T]], Batch],
    seed: int,
    shuffle: bool,
    workers: int,
    skip_batches: int = 0,
    pin: bool = False,
    whole: bool = False,
) -> DataLoader[T]:
    """A fine-tuning task's loader: shuffled by a generator seeded with ``seed`` (the same seed gives the
    same batches; ``skip_batches``: started that many batches in, where a resumed fit goes on) or in
    order, its batches collated by ``collate`` (packed when ``workers`` collate them), in page-locked
    memory when ``pin`` (:meth:`TrainPosition.pinned`). ``whole``: every batch holds ``batch_size`` rows,
    an epoch's last, smaller one left out (a compiled step would compile again for its size), unless the
    split is smaller than one batch."""
    if workers > 0:  # the Rust tokenizer's thread pool must not be used across fork
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    n = len(split)  # type: ignore[arg-type]
    drop = whole and n >= batch_size
    per_epoch = n // batch_size if drop else math.ceil(n / batch_size)
    sampler, generator = _shuffled(n, seed, batch_size, workers, skip_batches, per_epoch) if shuffle else (None, None)
    return DataLoader(
        split,
        batch_size,
        sampler=sampler,
        generator=generator,
        drop_last=drop,
        collate_fn=packed(collate, workers),
        num_workers=workers,
        persistent_workers=workers > 0,
        multiprocessing_context=direct_context() if workers > 0 else None,
        pin_memory=pin,
    )
