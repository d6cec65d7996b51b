"""The loaders' queues: the training process writes its small messages itself (no feeder thread to take
the interpreter lock from the step), in order, never blocking on a busy or full pipe; what a worker sends
goes through the feeder as before."""

from __future__ import annotations

import multiprocessing
import select
import threading
import time
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

import torch
from torch.utils.data import DataLoader, IterableDataset

from ablate.datamodules.handover import DirectQueue, direct_context


def _queue(method: str = "fork") -> tuple[DirectQueue, BaseContext]:
    ctx = multiprocessing.get_context(method)
    return DirectQueue(ctx=ctx), ctx


def _reader(q: DirectQueue, n: int, out: DirectQueue) -> None:
    out.put([q.get(timeout=30) for _ in range(n)])


def _read_in_child(ctx: BaseContext, q: DirectQueue, n: int) -> tuple[BaseProcess, DirectQueue]:
    out = DirectQueue(ctx=ctx)
    child = ctx.Process(target=_reader, args=(q, n, out))
    child.start()
    return child, out


def test_small_puts_are_written_by_the_caller_in_order():
    q, ctx = _queue()
    for i in range(50):
        q.put((i, None))
    assert q._thread is None  # type: ignore[attr-defined]  # no feeder thread was started
    child, out = _read_in_child(ctx, q, 50)
    assert out.get(timeout=30) == [(i, None) for i in range(50)]
    child.join(10)
    assert child.exitcode == 0


def test_a_large_message_goes_through_the_feeder_and_later_ones_keep_their_order():
    q, ctx = _queue()
    big = b"x" * (4 * select.PIPE_BUF)
    q.put(0)
    q.put(big)
    q.put(2)  # small, but after the feeder started: queued behind the large one
    assert q._thread is not None  # type: ignore[attr-defined]
    child, out = _read_in_child(ctx, q, 3)
    assert out.get(timeout=30) == [0, big, 2]
    child.join(10)


def test_a_full_pipe_never_blocks_the_owner():
    q, ctx = _queue()
    n = 0
    started = time.monotonic()
    while q._thread is None:  # type: ignore[attr-defined]  # direct writes until the pipe is full
        q.put(n)
        n += 1
        assert time.monotonic() - started < 30
    q.put(n)  # through the feeder: returns at once, sent once the reader drains the pipe
    child, out = _read_in_child(ctx, q, n + 1)
    assert out.get(timeout=60) == list(range(n + 1))
    child.join(10)


def test_a_writer_holding_the_pipe_is_not_waited_for():
    q, ctx = _queue()
    q._wlock.acquire()  # type: ignore[attr-defined]  # as a worker's feeder does while it writes
    try:
        q.put("while busy")
        assert q._thread is not None  # type: ignore[attr-defined]  # queued, not written
    finally:
        q._wlock.release()  # type: ignore[attr-defined]
    child, out = _read_in_child(ctx, q, 1)
    assert out.get(timeout=30) == ["while busy"]
    child.join(10)


def _put_from_child(q: DirectQueue) -> None:
    q.put("from the child")
    q.close()
    q.join_thread()


def test_another_process_puts_through_its_feeder():
    q, ctx = _queue("spawn")  # the queue pickled to a new interpreter keeps its owner
    child = ctx.Process(target=_put_from_child, args=(q,))
    child.start()
    assert q.get(timeout=60) == "from the child"
    child.join(30)
    assert child.exitcode == 0


class _Counting(IterableDataset[dict[str, torch.Tensor]]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(40):
            yield {"i": torch.tensor([i]), "x": torch.full((3, 5), float(i))}


def test_a_loader_on_it_gives_the_default_context_batches_without_a_feeder_thread():
    def batches(context: BaseContext | None) -> list[dict[str, torch.Tensor]]:
        loader = DataLoader(
            _Counting(), batch_size=None, num_workers=2, prefetch_factor=2, multiprocessing_context=context
        )
        got = []
        for batch in loader:
            got.append(batch)
            if context is not None:
                names = [t.name for t in threading.enumerate()]
                assert "QueueFeederThread" not in names
        return got

    plain, direct = batches(None), batches(direct_context())
    assert [b["i"].item() for b in direct] == [b["i"].item() for b in plain]
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(plain, direct, strict=True))


def test_a_loader_stopped_early_shuts_its_workers_down_at_once():
    loader = DataLoader(_Counting(), batch_size=None, num_workers=2, multiprocessing_context=direct_context())
    it = iter(loader)
    next(it)
    workers = list(it._workers)  # type: ignore[attr-defined]
    del it
    for w in workers:
        w.join(30)
    assert [w.exitcode for w in workers] == [0, 0]  # ended by their end-of-work message, not killed


def test_the_context_is_the_default_kind_with_this_queue():
    ctx = direct_context()
    assert ctx.get_start_method() == multiprocessing.get_start_method()
    assert isinstance(ctx.Queue(), DirectQueue)
