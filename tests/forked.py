"""``ablate`` commands in processes of their own, forked from a warm interpreter instead of started anew.

A test that needs a command in a separate process (to kill it, signal it, or run two workers at once) used to
start ``python -m ablate``, and each such interpreter spent about 9 s of a 2-core machine importing torch,
Lightning (with torchmetrics, scipy and transformers) and MLflow before the command began. Here one server per
test process (:mod:`multiprocessing`'s fork server) imports those once, and each command runs in a child forked
from it: a process of its own (its pid, process group, signals, exit status, cwd, environment and output),
that runs ``ablate.cli.main`` as ``python -m ablate`` does, and whose interpreter exits as Python's does (its
``atexit`` functions run). What a module reads from the environment as it is imported is read again from the
child's (ablate's one such value, and torch's thread count).

What differs from a new interpreter: what the libraries print *while they are imported* is printed once, by the
server. Where that is what a test reads (the training commands of tests/test_quiet_commands.py,
tests/test_quiet.py) it starts a new interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import reduction
from pathlib import Path
from typing import IO

#: What the commands import: loaded by the server once (a module missing here is imported by the child).
PRELOAD = [
    "ablate.cli",
    "ablate.commands",
    "ablate.results",
    "ablate.process",
    "ablate.sweeps.engine.runner",
    "ablate.sweeps.study",
    "ablate.sweeps.workers",
    "ablate.reports.build",
]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)

Output = int | IO[str] | None  # subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT, an open file, or inherited


class _Fd:
    """A file descriptor handed to the child (duplicated into it through the fork server)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return _received, (reduction.DupFd(self.fd),)


def _received(dup: object) -> _Fd:
    return _Fd(dup.detach())  # type: ignore[attr-defined]  # multiprocessing's DupFd, untyped


def _child(
    args: list[str], cwd: str, env: dict[str, str], out: _Fd | None, err: _Fd | None, session: bool, ready: _Fd
) -> None:
    """In the forked child: become the process ``python -m ablate ARGS`` would be, run the command, exit."""
    if session:
        os.setsid()
    os.close(ready.fd)  # the parent's popen returns: the session is made (as Popen returns after it)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, target in ((1, out), (2, err)):
        if target is not None:
            os.dup2(target.fd, fd)
    for target in {id(t): t for t in (out, err) if t is not None}.values():  # one object where stderr joins stdout
        os.close(target.fd)
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper
    import ablate.cli
    from ablate.sweeps.engine import tracking

    tracking.USER_TRACKING_URI = env.get("MLFLOW_TRACKING_URI")  # read at its import: read again, from this env
    threads = env.get("OMP_NUM_THREADS")
    if threads:  # read by torch's thread pool when the server imported torch: set it as a new interpreter would
        import torch

        torch.set_num_threads(int(threads))
    sys.argv = [str(Path(ablate.cli.__file__).with_name("__main__.py")), *args]  # what python -m ablate has
    code = 1
    try:
        code = ablate.cli.main(args)
    finally:
        atexit._run_exitfuncs()  # what the interpreter runs at its exit (multiprocessing's child would skip it)
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


class Forked:
    """A command running in a forked child: the parts of :class:`subprocess.Popen` the tests use."""

    def __init__(self, process: multiprocessing.process.BaseProcess, stdout: IO[str] | None, stderr: IO[str] | None):
        self._process = process
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None, "started"
        return pid

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(["ablate"], timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal the child; nothing once it has ended (the fork server reaps it at once: no zombie keeps its pid)."""
        self._signal(os.kill, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the child's process group (``start_new_session``: the child and its loader workers);
        nothing once the child has ended."""
        self._signal(os.killpg, sig)

    def _signal(self, send: Callable[[int, int], None], sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended between the poll and the signal
                send(self.pid, sig)


def _target(spec: Output, pipes: list[int]) -> tuple[_Fd | None, IO[str] | None]:
    """The child's descriptor for one stream, and the parent's reading end where it is a pipe."""
    if spec is None:
        return None, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        pipes.append(w)
        return _Fd(w), open(r, encoding="utf-8", errors="replace")  # noqa: SIM115 - the caller reads and closes it
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_WRONLY)
        pipes.append(fd)
        return _Fd(fd), None
    assert not isinstance(spec, int), f"unsupported stream: {spec}"
    return _Fd(spec.fileno()), None


def popen(
    args: Sequence[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str],
    stdout: Output = None,
    stderr: Output = None,
    start_new_session: bool = False,
) -> Forked:
    """Start ``ablate ARGS`` in ``cwd`` with exactly ``env``, as :class:`subprocess.Popen` would start
    ``python -m ablate ARGS`` (text streams; ``stderr=subprocess.STDOUT`` joins them)."""
    opened: list[int] = []
    out, out_reader = _target(stdout, opened)
    if stderr == subprocess.STDOUT:
        err, err_reader = (out if out is not None else _Fd(1)), None
    else:
        err, err_reader = _target(stderr, opened)
    ready, started = os.pipe()
    opened.append(started)
    process = _CONTEXT.Process(
        target=_child, args=([*args], str(cwd), dict(env), out, err, start_new_session, _Fd(started)), name="ablate"
    )
    try:
        process.start()
    finally:
        for fd in opened:  # the child holds its own copies: a pipe ends when the child does
            os.close(fd)
    os.read(ready, 1)  # returns once the child closed its end (or ended)
    os.close(ready)
    multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]  # not joined at exit: as Popen's
    return Forked(process, out_reader, err_reader)


def run(
    args: Sequence[str], *, cwd: str | Path, env: Mapping[str, str], timeout: float, joined: bool = False
) -> subprocess.CompletedProcess[str]:
    """``ablate ARGS`` to its end: its exit status, stdout and stderr (as ``subprocess.run(...,
    capture_output=True, text=True, timeout=...)`` gives them; ``joined``: stderr into stdout, as
    ``stdout=PIPE, stderr=STDOUT`` gives it); TimeoutExpired kills it first."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out, tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        proc = popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT if joined else err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["ablate", *args], code, out.read(), None if joined else err.read())
