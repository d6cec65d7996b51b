"""A batch crosses from a DataLoader worker as one buffer, by value, and unpacks to the same dict."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from ablate.datamodules.transfer import PackedBatch, packed, unpack


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


@pytest.mark.parametrize("workers", [0, 1])
def test_a_shuffled_task_loader_draws_as_a_seeded_shuffle_and_resumes_at_any_batch(workers):
    """The loader's order is ``DataLoader(shuffle=True, generator=seeded)``'s, epoch after epoch; one
    started k batches in (a resumed fit) goes on with the batch the first would have given next."""
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
    )
    ours = task_loader(rows, 5, collate, 7, True, workers)
    want = batches(plain, 4)
    assert batches(ours, 4) == want and len(want) == 20
    for k in (1, 4, 5, 7, 12):  # inside the first epoch, at an epoch's end, in later epochs
        resumed = task_loader(rows, 5, collate, 7, True, workers, skip_batches=k)
        first = batches(resumed, 1)  # the rest of the epoch it was stopped in
        assert first == want[k : (k // 5 + 1) * 5]
        assert batches(resumed, 1) == want[(k // 5 + 1) * 5 : (k // 5 + 2) * 5]  # and its next epoch
