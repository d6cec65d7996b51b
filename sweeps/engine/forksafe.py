"""Database connections and DDP's forked ranks: :func:`install` makes every SQLAlchemy pool refuse a connection
another process opened (SQLAlchemy's recipe for ``os.fork()``), so that forked ranks never share the worker's
Optuna and MLflow connections. Why, and where it is installed: docs/development.md ("How a run is executed")."""

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


def _remember_pid(dbapi_connection: object, record: Any) -> None:  # noqa: ANN401 - SQLAlchemy's pool entry
    record.info["pid"] = os.getpid()


def _refuse_inherited(dbapi_connection: object, record: Any, proxy: Any) -> None:  # noqa: ANN401 - pool entry, proxy
    if record.info.get("pid", os.getpid()) != os.getpid():
        record.dbapi_connection = proxy.dbapi_connection = None  # the parent's: not ours to close
        raise exc.DisconnectionError(f"connection opened by process {record.info['pid']}, not {os.getpid()}")
