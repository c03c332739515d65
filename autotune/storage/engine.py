"""The engine's options per backend and SQLite's ``BEGIN IMMEDIATE``: how
:class:`autotune.storage.db.Storage` connects (pool size, pre-ping, isolation)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from autotune.storage.urls import backend_of

__all__ = ["engine_kwargs"]


def engine_kwargs(url: str, connections: int = 1, *,
                  busy_timeout_s: float = 120) -> dict[str, Any]:
    """Engine options per backend. Many workers share one server (dozens on one study against
    PostgreSQL's default ``max_connections`` of 100, three of them reserved), so a worker
    holds ``connections`` (one per trial run side by side) and never more: a heartbeat that
    renews a lease during a record waits the record's few milliseconds for the connection,
    and nothing of autotune's opens a connection while it holds one (Optuna's start-up check
    would: :meth:`Storage._check_optuna_schema`). With one more allowed per worker, dozens of
    workers fill the server at their peak and the rest wait ``pool_timeout``. Connections
    are checked before use (a batch job may sit idle for hours). SQLite: a writer waits
    ``busy_timeout_s`` for the lock, then fails "database is locked"
    (:mod:`autotune.storage.limits`)."""
    backend = backend_of(url)
    if backend == "sqlite":
        return {"connect_args": {"timeout": busy_timeout_s}}
    kwargs: dict[str, Any] = {"pool_size": connections, "max_overflow": 0, "pool_timeout": 300,
                              "pool_pre_ping": True, "pool_recycle": 1800}
    if backend == "mysql":
        # InnoDB's default REPEATABLE READ takes a transaction's snapshot at its first plain
        # read, before the study lock of a claim: its count of the study's trials (the new
        # trial's number) and claims would then miss what others committed meanwhile. READ
        # COMMITTED, PostgreSQL's default, reads what the lock's holder sees.
        kwargs["isolation_level"] = "READ COMMITTED"
    return kwargs


def _no_pool(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``engine_kwargs`` without the pool's options (for an engine without a pool)."""
    return {k: v for k, v in kwargs.items() if not k.startswith("pool") and k != "max_overflow"}


def _sqlite_immediate(engine: Engine) -> None:
    """Every SQLite transaction takes the writer lock at BEGIN (``BEGIN IMMEDIATE``).

    A deferred transaction that reads and then writes can meet another one doing the same
    and be refused at once (SQLite cannot wait out that deadlock); a claim reads the
    study's claims and writes its own in one transaction. The pysqlite recipe of
    SQLAlchemy's SQLite dialect docs ("Serializable isolation / Savepoints / Transactional
    DDL"): the driver's own BEGIN is turned off, the engine's begin event issues ours.
    """
    @event.listens_for(engine, "connect")
    def _no_driver_begin(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections made before the listeners: made again with them
