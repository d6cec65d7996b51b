"""What a process reads once and hands over from memory to every later run: the last few values
computed, by a key that names everything they are made of (a study's worker runs many trials over
the same validation batches and the same tokenized task)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class Kept(Generic[T]):
    """The last ``size`` values computed in this process, by key (the oldest dropped first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: dict[str, T] = {}

    def get(self, made_of: object, compute: Callable[[], T]) -> T:
        """The value made of ``made_of`` (its ``repr`` is the key): kept, or computed and kept."""
        key = hashlib.sha256(repr(made_of).encode()).hexdigest()
        if key not in self._values:
            self._values[key] = compute()
            while len(self._values) > self.size:
                self._values.pop(next(iter(self._values)))
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)


def files_state(files: Iterable[str | Path]) -> tuple[tuple[str, int, int], ...]:
    """Size and modification time of each file (a rewritten file makes a new key; a missing one is left out)."""
    out = []
    for name in files:
        with contextlib.suppress(OSError):
            st = Path(name).stat()
            out.append((str(name), st.st_size, st.st_mtime_ns))
    return tuple(out)
