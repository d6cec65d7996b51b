"""The DataLoader's multiprocessing context for ablate's loaders: its queues write a small message
from the process that made them straight into the pipe, instead of waking the queue's feeder thread.
Why: in the training process that thread took the interpreter lock back and forth with every tensor
operation of the step it overlapped (docs/data.md, "Handing batches over")."""

from __future__ import annotations

import functools
import multiprocessing
import os
import select
import threading
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.queues import Queue
from multiprocessing.reduction import ForkingPickler
from multiprocessing.synchronize import BoundedSemaphore, Lock
from typing import Protocol, cast

_SMALL = getattr(select, "PIPE_BUF", 512)
"""The largest message written at once: a pipe takes a write of at most this many bytes whole."""


class _Internals(Protocol):
    """What :class:`multiprocessing.queues.Queue` keeps of its pipe (CPython's own attributes)."""

    _closed: bool
    _thread: threading.Thread | None
    _wlock: Lock | None  # None on Windows, where a pipe takes every write whole
    _sem: BoundedSemaphore
    _writer: Connection


class DirectQueue(Queue):  # type: ignore[type-arg]  # generic in typeshed only
    """A ``multiprocessing`` queue whose owner's small puts are written by the caller.

    In the process that made it (the training process, for a DataLoader's queues), a message that
    pickles to at most ``PIPE_BUF`` bytes is written to the pipe at once, when no writer holds the
    pipe and it has room: the batch indices the loader sends its workers each step, and its
    end-of-work messages. Anything else (a batch a worker sends; a put while the pipe is busy or
    full; every put once the feeder thread has started, so that messages keep their order) goes
    through the feeder thread as in :class:`multiprocessing.queues.Queue`.
    """

    def __init__(self, maxsize: int = 0, *, ctx: BaseContext) -> None:
        super().__init__(maxsize, ctx=ctx)
        self._owner: int | None = os.getpid()  # not pickled: a spawned process's copy has none
        self._room: select.poll | None = None  # asks whether the pipe has room; made at the first put here

    def put(self, obj: object, block: bool = True, timeout: float | None = None) -> None:
        """``obj`` written now where it can be (see the class), else queued for the feeder thread."""
        if not self._written_now(obj):
            super().put(obj, block, timeout)

    def _written_now(self, obj: object) -> bool:
        q = cast(_Internals, self)
        if getattr(self, "_owner", None) != os.getpid() or q._closed or q._thread is not None or q._wlock is None:
            return False
        payload = ForkingPickler.dumps(obj)
        if len(payload) > _SMALL or not q._wlock.acquire(False):  # a worker is writing: never wait on a writer
            return False
        try:
            if self._room is None:
                self._room = select.poll()
                self._room.register(q._writer.fileno(), select.POLLOUT)
            if not self._room.poll(0) or not q._sem.acquire(False):  # full: a write could block until the reader reads
                return False
            q._writer.send_bytes(payload)
            return True
        finally:
            q._wlock.release()


@functools.cache
def direct_context() -> BaseContext:
    """The default multiprocessing context, its ``Queue()`` a :class:`DirectQueue`
    (``DataLoader(multiprocessing_context=...)``)."""
    base = multiprocessing.get_context()

    class _Context(type(base)):  # type: ignore[misc]  # the default context's own class
        def Queue(self, maxsize: int = 0) -> DirectQueue:  # noqa: N802  # multiprocessing's name
            return DirectQueue(maxsize, ctx=base)

    return cast(BaseContext, _Context())
