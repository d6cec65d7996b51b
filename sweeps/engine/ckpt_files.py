"""How a run's checkpoint files are written: from a host copy taken at the save, by one background thread
per run, to a temporary file beside the target renamed into place (:class:`FileWriter`, the Trainer's
CheckpointIO); a file that holds what another file written at the same step holds, as a hard link to it
(:func:`link_copy`). Why: docs/performance.md ("Checkpoint files")."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH
from lightning_utilities.core.apply_func import apply_to_collection


def local_path(path: str | Path) -> Path | None:
    """``path`` as a local file's path; None for another filesystem (an fsspec URL such as ``s3://``)."""
    fs, inner = fsspec.core.url_to_fs(str(path))
    return Path(inner) if isinstance(fs, LocalFileSystem) else None


def host_copy(state: Any) -> Any:
    """``state`` with every tensor copied into host memory now (the step after a save changes the weights
    in place), tensors that share a storage (tied weights, views) sharing one copy, as ``torch.save`` keeps them."""
    copies: dict[tuple[str, int], torch.UntypedStorage] = {}

    def copy(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if type(t) is not torch.Tensor:  # a tensor subclass: copied whole
            return t.to("cpu", copy=True)
        storage = t.untyped_storage()
        key = (str(storage.device), storage.data_ptr())
        if key not in copies:
            raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)  # its bytes
            copies[key] = raw.to("cpu", copy=True).untyped_storage()
        return torch.empty(0, dtype=t.dtype).set_(copies[key], t.storage_offset(), t.size(), t.stride())

    return apply_to_collection(state, torch.Tensor, copy)


def _into_place(target: Path, write: Callable[[Path], object]) -> None:
    """``write`` a temporary file beside ``target``, renamed into place when whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        write(partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


class FileWriter(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoints, written to a local disk in the background.

    A save copies the checkpoint's tensors into host memory (:func:`host_copy`) and returns: one thread
    writes it while training goes on (350 MB at BERT-small took 0.5 to 0.8 s here, the run waiting).
    ``torch.save`` writes a temporary file beside the target, renamed into place when whole (a reader
    never sees part of a checkpoint), every save a new file, so a hard link to an earlier one
    (:func:`link_copy`) keeps what it held. Work that needs a written file (a link, an upload) goes in
    the same queue (:meth:`then`). Other filesystems (fsspec URLs) are written as Lightning writes them,
    at once. A save waits for the saves before the last one (not for links or uploads), so that host
    memory holds at most two states. A write's error is raised by the next save, :meth:`wait` or :meth:`teardown`.

    Args:
        held: the writer of a run, shared by its fits: each fit's end leaves the writes going and the run
            closes it (:meth:`close`) before it ends; not held: each fit's end waits. A copy in another process
            (a spawned DDP rank) waits at its fit's end.
    """

    def __init__(self, held: bool = False) -> None:
        super().__init__()
        self.held = held
        self._owner = os.getpid()  # the run's process: a forked or spawned rank's copy waits at its fit's end
        self._pid = self._owner  # the process whose thread the pool has
        self._pool: ThreadPoolExecutor | None = None
        self._queued: list[Future[object]] = []
        self._saves: list[Future[object]] = []  # the queued saves (each holds a state in host memory)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None, "_queued": [], "_saves": []}

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        target = local_path(path)
        if target is None or storage_options is not None:
            self.wait()
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        self._this_process()
        for earlier in self._saves[:-1]:  # host memory holds at most two states: the last save's and this one
            earlier.exception()  # waits for it
        self._raise_finished()  # a finished write's error, raised now
        state = host_copy(checkpoint)
        self.then(lambda: _into_place(target, lambda partial: torch.save(state, partial)))
        self._saves = [*(f for f in self._saves if not f.done()), self._queued[-1]]

    def _this_process(self) -> None:
        """In a process forked from the one that queued the works (a DDP rank): none of them, no thread yet."""
        if self._pid != os.getpid():
            self._pool, self._pid, self._queued, self._saves = None, os.getpid(), [], []

    def then(self, work: Callable[[], object]) -> None:
        """Run ``work`` in the writer's thread, after the writes asked for before."""
        self._this_process()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "ablate-checkpoints")
        self._queued.append(self._pool.submit(work))

    def _raise_finished(self) -> None:
        """Forget the finished works, raising the first one's error."""
        done, self._queued = [f for f in self._queued if f.done()], [f for f in self._queued if not f.done()]
        for f in done:
            f.result()

    def wait(self) -> None:
        """Wait for every write and work queued; raise the first one's error."""
        self._this_process()
        for queued in self._queued:
            queued.exception()  # waits for it
        self._raise_finished()

    def teardown(self) -> None:
        if not self.held or self._owner != os.getpid():
            self.wait()

    def close(self) -> None:
        """Wait for everything queued (raising the first error) and end the writer's thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = None


def link_copy(source: str | Path, target: str | Path) -> bool:
    """Make ``target`` hold what ``source`` holds, as a hard link (replacing ``target`` at once); False, and
    nothing changed, where that cannot be done (not both on one local filesystem, links not supported)."""
    a, b = local_path(source), local_path(target)
    if a is None or b is None or not a.is_file():
        return False
    partial = b.with_name(f".{b.name}.{os.getpid()}.link")
    try:
        partial.unlink(missing_ok=True)
        os.link(a, partial)
        os.replace(partial, b)
    except OSError:
        partial.unlink(missing_ok=True)
        return False
    return True


def same_file(source: Path, target: Path) -> None:
    """Make ``target`` hold what ``source`` holds: a hard link (:func:`link_copy`), else a copy written
    beside it and renamed into place."""
    if not link_copy(source, target):
        _into_place(target, lambda partial: shutil.copyfile(source, partial))
