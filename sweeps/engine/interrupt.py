"""Stopping a run from outside: :func:`install` makes SIGINT and SIGTERM raise :class:`Interrupted` (a
KeyboardInterrupt that knows its signal) in the command's process; the run's owner ends the run KILLED and the
command exits with 128 + the signal's number (130, 143). Details: docs/development.md ("How a run is executed")."""

from __future__ import annotations

import os
import signal
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop by ``signum``: a KeyboardInterrupt (what code that handles Ctrl-C
    catches: Lightning's fit ends its loop and callbacks, Optuna fails the trial and re-raises it)
    that knows its signal."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.runs: list[str] = []  # the runs it ended KILLED, innermost first
        self.advice = ""  # what resumes the work, said by the command that was stopped
        self.others_go_on = False  # a study's worker stopped while others run on (the study's run stays RUNNING)
        super().__init__(f"signal {self.name}")

    @property
    def name(self) -> str:
        """``SIGINT``, ``SIGTERM``."""
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """The shell's status of a process ended by the signal: 128 + its number."""
        return 128 + self.signum


def signalled(exc: BaseException) -> Interrupted | None:
    """The :class:`Interrupted` that ``exc`` is, or was raised from or while handling; None: none."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, Interrupted):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def as_interrupted(exc: BaseException) -> Interrupted:
    """``exc`` (an Interrupted, a KeyboardInterrupt, or the ``SystemExit`` Lightning ends a fit with) as an
    :class:`Interrupted`: the one it carries, else SIGTERM for Lightning's ``SIGTERMException``, else SIGINT
    (a KeyboardInterrupt where :func:`install` was not called: a library user's process)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    found = signalled(exc)
    if found is not None:
        return found
    return Interrupted(signal.SIGTERM if isinstance(exc, SIGTERMException) else signal.SIGINT)


_owner: int | None = None


def _raise(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _owner:  # a forked worker or rank: what Python would do there
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)
        return
    for other in HANDLED:  # once: the runs are being ended
        signal.signal(other, signal.SIG_IGN)
    raise Interrupted(signum)


def install() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` in this process (from the main thread only)."""
    global _owner
    _owner = os.getpid()
    for signum in HANDLED:
        signal.signal(signum, _raise)
