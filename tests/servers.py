"""Real servers for the distributed tests: a private PostgreSQL cluster and an MLflow server.

Both listen on loopback only, live in a temporary folder and are stopped (and removed)
when their context ends, also when the test fails. PostgreSQL comes from Debian: if its
binaries are missing, ``apt-get install postgresql`` is run first (the tests run as root
on the CI machine). PostgreSQL refuses to run as root, so the cluster runs as the
``postgres`` user the Debian package creates.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PG_GLOB = "/usr/lib/postgresql/*/bin"


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``, installing Debian's PostgreSQL if absent."""
    found = sorted(glob.glob(PG_GLOB), key=lambda p: int(Path(p).parent.name))
    if not found:
        with open("/tmp/ablate-apt.lock", "w") as lock:  # two test workers: one installs, the other waits
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _install_postgres()
    return Path(found[-1])


def _install_postgres() -> Path:
    found = sorted(glob.glob(PG_GLOB), key=lambda p: int(Path(p).parent.name))
    if not found:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
            check=True,
            env=env,
            capture_output=True,
            timeout=900,
        )
        found = sorted(glob.glob(PG_GLOB), key=lambda p: int(Path(p).parent.name))
    if not found:
        raise RuntimeError("PostgreSQL is not installed and apt-get did not install it")
    return Path(found[-1])


def _as_postgres(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


@dataclass(frozen=True)
class Postgres:
    """A running private cluster (user ``postgres``, trust auth on loopback)."""

    port: int
    root: Path

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        _as_postgres(
            [
                str(postgres_bin() / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-c",
                f'CREATE DATABASE "{name}"',
            ],
            timeout=60,
        )
        return self.url(name)


@contextlib.contextmanager
def postgres_cluster() -> Iterator[Postgres]:
    """initdb + pg_ctl start in a temporary folder; stopped and removed afterwards."""
    bindir = postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="ablate-pg-", dir="/tmp"))
    data = root / "data"
    port = free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    try:
        _as_postgres(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"], timeout=120
        )
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        _as_postgres(
            [str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "-t", "60", "start"],
            timeout=90,
        )
        yield Postgres(port, root)
    finally:
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError):
                _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class MlflowServer:
    url: str
    artifacts: Path


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path) -> Iterator[MlflowServer]:
    """``mlflow server`` on a free loopback port, serving artifacts from ``artifacts``."""
    port = free_port()
    exe = Path(sys.executable).with_name("mlflow")
    log = open(artifacts.parent / f"mlflow-server-{port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            str(exe),
            "server",
            "--backend-store-uri",
            backend_uri,
            "--artifacts-destination",
            str(artifacts),
            "--serve-artifacts",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited {proc.returncode}: {(artifacts.parent / log.name).read_text()[-2000:]}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not answer /health within 180 s")
            time.sleep(0.5)
        yield MlflowServer(url, artifacts)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
