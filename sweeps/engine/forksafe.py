"""Database connections and DDP's forked ranks.

A trial on several devices forks its ranks at ``fit`` (:func:`ablate.sweeps.engine.trainer.lightning_strategy`).
The ranks inherit the worker's SQLAlchemy pools (Optuna's storage, MLflow's SQL store) while the
worker keeps using them (Optuna's heartbeat thread). A connection must never be shared by two
processes, so a pooled connection made by another process is refused at checkout and the pool
opens a fresh one; the inherited socket is left to its owner, not closed. This is SQLAlchemy's
documented recipe ("Using Connection Pools with Multiprocessing or os.fork()"), applied to
every pool. :func:`install` installs it, once: the ``ablate`` command at its start (before any pool
exists), and a run that forks DDP ranks before forking.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.pool import Pool


def install() -> None:
    """Make every SQLAlchemy pool of this process refuse a connection another process opened
    (idempotent). A connection opened before the first call carries no owner and is not refused."""
    if not event.contains(Pool, "connect", _remember_pid):
        event.listen(Pool, "connect", _remember_pid)
        event.listen(Pool, "checkout", _refuse_inherited)


def _remember_pid(dbapi_connection: Any, record: Any) -> None:
    record.info["pid"] = os.getpid()


def _refuse_inherited(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    if record.info.get("pid", os.getpid()) != os.getpid():
        record.dbapi_connection = proxy.dbapi_connection = None  # the parent's: not ours to close
        raise exc.DisconnectionError(f"connection opened by process {record.info['pid']}, not {os.getpid()}")
