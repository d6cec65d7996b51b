"""What a benchmark is doing while it runs, on stderr (its tables go to stdout): rich's live progress on
a terminal; otherwise :class:`LineProgress`, the same calls written as plain time-stamped lines (one
per new task or description, a long task's count every ``every_s`` seconds), so a log reads top to bottom."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class LineProgress(Progress):
    """A :class:`rich.progress.Progress` that prints plain lines instead of a live display.

    Args:
        console: where the lines go (stderr).
        every_s: at least this long between two count lines of the same task.
    """

    def __init__(self, console: Console, every_s: float = 15.0) -> None:
        super().__init__(console=console, disable=True)
        self.every_s = every_s
        self._begin = time.monotonic()
        self._said: dict[TaskID, tuple[str, float]] = {}

    def say(self, text: str) -> None:
        """One line, stamped with the seconds since the benchmark started."""
        self.console.print(f"[{time.monotonic() - self._begin:7.1f} s] {text}", markup=False, highlight=False)

    def add_task(
        self,
        description: str,
        start: bool = True,
        total: float | None = 100.0,
        completed: int = 0,
        visible: bool = True,
        **fields: object,
    ) -> TaskID:
        task = super().add_task(description, start, total, completed, visible, **fields)
        self.say(description)
        self._said[task] = (description, time.monotonic())
        return task

    def update(
        self,
        task_id: TaskID,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        visible: bool | None = None,
        refresh: bool = False,
        **fields: object,
    ) -> None:
        super().update(
            task_id,
            total=total,
            completed=completed,
            advance=advance,
            description=description,
            visible=visible,
            refresh=refresh,
            **fields,
        )
        self._tell(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._tell(task_id)

    def _tell(self, task_id: TaskID) -> None:
        """A new description at once; the count of a sized task every ``every_s`` seconds."""
        task = self._tasks[task_id]
        said, when = self._said.get(task_id, ("", 0.0))
        now = time.monotonic()
        if task.description != said:
            self.say(task.description)
        elif task.total and now - when >= self.every_s:
            self.say(f"{task.description}: {task.completed:.0f}/{task.total:.0f}")
        else:
            return
        self._said[task_id] = (task.description, now)


def progress_for(console: Console) -> Progress:
    """Live progress on a terminal, :class:`LineProgress` otherwise."""
    if console.is_terminal:
        return Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
    return LineProgress(console)
