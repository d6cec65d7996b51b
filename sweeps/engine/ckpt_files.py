"""How a run's checkpoint files are written: straight to a temporary file beside the target, then renamed
into place (:class:`FileWriter`, the Trainer's CheckpointIO), and a file that holds what another file
written at the same step holds, as a hard link to it (:func:`link_copy`). Why: docs/performance.md
("Checkpoint files")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH


def local_path(path: str | Path) -> Path | None:
    """``path`` as a local file's path; None for another filesystem (an fsspec URL such as ``s3://``)."""
    fs, inner = fsspec.core.url_to_fs(str(path))
    return Path(inner) if isinstance(fs, LocalFileSystem) else None


class FileWriter(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoints, written to a local disk without an in-memory copy.

    Lightning serializes the whole checkpoint into memory first and then copies it to its file: a
    BERT-small pre-training checkpoint with its AdamW state (about 350 MB) took 0.7 s that way, 0.5 s
    written straight (docs/performance.md). Here ``torch.save`` writes a temporary file beside the
    target, renamed into place when it is whole: as atomic as Lightning's write (a reader never sees
    part of a checkpoint), and every save a new file, never one rewritten in place, so a hard link to an
    earlier one (:func:`link_copy`) keeps what it held. Other filesystems (fsspec URLs) are written as
    Lightning writes them.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        target = local_path(path)
        if target is None or storage_options is not None:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            torch.save(checkpoint, partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)


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
