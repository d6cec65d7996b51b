"""A batch crosses from a DataLoader worker as one buffer, by value, and unpacks to the same dict; an
endless stream's batches cross a few at a time and come back one at a time in the plain loader's order."""

from __future__ import annotations

import itertools
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from ablate.datamodules.transfer import GROUP, GroupedLoader, PackedBatch, PackedGroup, packed, unpack


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {  # odd sizes and mixed dtypes: every field must still start where its dtype can be viewed
        "input_ids": torch.randint(0, 30000, (3, 7), generator=g),
        "attention_mask": torch.rand(3, 7, generator=g) > 0.3,
        "weights": torch.rand(5, generator=g, dtype=torch.float64),
        "label": torch.tensor([1, 0, 1], dtype=torch.int32),
    }


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


# three workers on purpose (more than this 2-core machine's): the order must hold for any count
MORE_WORKERS_THAN_CORES = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def test_pack_unpack_round_trip_as_views_of_one_buffer():
    batch = _batch()
    p = PackedBatch.pack(batch)
    assert p.buffer.dtype == torch.uint8 and p.buffer.dim() == 1
    out = p.unpack()
    assert _equal(out, batch)
    assert all(t.untyped_storage().data_ptr() == p.buffer.untyped_storage().data_ptr() for t in out.values())
    assert unpack(batch) is batch  # a plain dict passes through


def test_pickled_by_value_not_through_shared_memory():
    p = PackedBatch.pack(_batch())
    data = bytes(ForkingPickler.dumps(p))
    assert len(data) > p.buffer.numel()  # the bytes travel in the message itself
    again = pickle.loads(data)
    assert _equal(again.unpack(), _batch())
    assert not again.buffer.is_shared()


class _Batches(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        yield from (_batch(seed) for seed in range(info.id, 8, info.num_workers))


def test_workers_hand_over_packed_batches_that_unpack_to_the_originals():
    loader = DataLoader(_Batches(), batch_size=None, num_workers=2, collate_fn=packed(None, 2))
    got = list(loader)
    assert all(isinstance(b, PackedBatch) for b in got)
    assert len(got) == 8
    want = {round(_batch(s)["weights"][0].item(), 12): _batch(s) for s in range(8)}
    for b in got:
        d = unpack(b)
        assert _equal(d, want[round(d["weights"][0].item(), 12)])
    assert packed(None, 0) is None  # no workers: the loader's own default, nothing packed


@pytest.mark.cuda
def test_pinned_and_moved_in_one_copy():
    p = PackedBatch.pack(_batch()).pin_memory()
    assert p.buffer.is_pinned()
    on_gpu = p.to("cuda", non_blocking=True).unpack()
    assert all(t.is_cuda for t in on_gpu.values())
    assert _equal({k: v.cpu() for k, v in on_gpu.items()}, _batch())


@pytest.mark.parametrize(("workers", "whole"), [(0, False), (1, False), (0, True), (1, True)])
def test_a_shuffled_task_loader_draws_as_a_seeded_shuffle_and_resumes_at_any_batch(workers, whole):
    """The loader's order is ``DataLoader(shuffle=True, generator=seeded)``'s, epoch after epoch; one
    started k batches in (a resumed fit) goes on with the batch the first would have given next. ``whole``
    (a compiled step's loader): every batch of 5 rows, each epoch's last 3 rows left out, as ``drop_last``."""
    import torch
    from torch.utils.data import DataLoader

    from ablate.datamodules.transfer import task_loader

    rows = [{"x": torch.tensor([i])} for i in range(23)]

    def collate(batch):
        return {"x": torch.cat([r["x"] for r in batch])}

    def batches(loader, epochs):
        return [unpack(b)["x"].tolist() for _ in range(epochs) for b in loader]

    seeded = torch.Generator().manual_seed(7)
    plain = DataLoader(
        rows,
        5,
        shuffle=True,
        generator=seeded,
        collate_fn=packed(collate, workers),
        num_workers=workers,
        persistent_workers=workers > 0,
        drop_last=whole,
    )
    ours = task_loader(rows, 5, collate, 7, True, workers, whole=whole)
    want = batches(plain, 5)
    e = 4 if whole else 5  # batches an epoch
    assert batches(ours, 5) == want and len(want) == 5 * e
    assert all(len(b) == 5 for b in want) == whole
    for k in (1, 3, 4, 5, 7, 12):  # inside the first epoch, at an epoch's end, in later epochs
        resumed = task_loader(rows, 5, collate, 7, True, workers, skip_batches=k, whole=whole)
        first = batches(resumed, 1)  # the rest of the epoch it was stopped in
        assert first == want[k : (k // e + 1) * e]
        assert batches(resumed, 1) == want[(k // e + 1) * e : (k // e + 2) * e]  # and its next epoch


def test_whole_batches_keep_a_split_smaller_than_a_batch():
    from ablate.datamodules.transfer import task_loader

    rows = [{"x": torch.tensor([i])} for i in range(3)]
    loader = task_loader(rows, 5, lambda b: {"x": torch.cat([r["x"] for r in b])}, 7, True, 0, whole=True)
    assert [len(b["x"]) for b in loader] == [3]  # not an empty epoch


class _Endless(IterableDataset[dict[str, torch.Tensor]]):
    """Each worker's own endless batches, labelled (worker, its count): the order the loader gives them shows."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        for i in itertools.count():
            yield {"label": torch.tensor([worker, i]), "rows": torch.full((i % 3 + 1, 2), i)}  # shapes vary


def test_a_group_crosses_as_one_buffer_and_gives_its_batches_back():
    group = PackedGroup.pack([_batch(0), _batch(1), _batch(2)])
    back = pickle.loads(ForkingPickler.dumps(group))
    assert len(back.parts) == 3 and all(start % 16 == 0 for start, _, _ in back.parts)
    for seed, part in enumerate(back.batches()):
        assert _equal(part.unpack(), _batch(seed))
        assert part.buffer.untyped_storage().data_ptr() == back.buffer.untyped_storage().data_ptr()


@MORE_WORKERS_THAN_CORES
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_grouped_loader_gives_the_batches_in_the_order_a_plain_loader_gives(workers):
    plain = DataLoader(_Endless(), batch_size=None, collate_fn=packed(None, workers), num_workers=workers)
    grouped = GroupedLoader(_Endless(), batch_size=GROUP, collate_fn=PackedGroup.pack, num_workers=workers)
    n = 5 * GROUP * workers + 3
    expected = [unpack(b) for b in itertools.islice(plain, n)]
    got = list(itertools.islice(grouped, n))
    assert all(isinstance(b, PackedBatch) for b in got)
    assert [b["label"].tolist() for b in expected] == [b.unpack()["label"].tolist() for b in got]
    assert all(_equal(a, b.unpack()) for a, b in zip(expected, got, strict=True))


class _Global(IterableDataset[dict[str, torch.Tensor]]):
    """Worker w of k yields global batches w, w + k, ..., the first ``skip`` of the stream left out (a resumed fit)."""

    def __init__(self, skip: int) -> None:
        self.skip = skip

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for g in itertools.count(worker, workers):
            if g >= self.skip:
                yield {"index": torch.tensor([g])}


@MORE_WORKERS_THAN_CORES
@pytest.mark.parametrize(("workers", "skip"), [(2, 5), (3, 7), (3, 9)])
def test_a_resumed_grouped_loader_goes_on_in_the_streams_order(workers, skip):
    loader = GroupedLoader(
        _Global(skip), batch_size=GROUP, collate_fn=PackedGroup.pack, num_workers=workers, first_worker=skip
    )
    got = [int(b.unpack()["index"]) for b in itertools.islice(loader, 3 * GROUP * workers)]
    assert got == list(range(skip, skip + 3 * GROUP * workers))
