"""No transaction of autotune's is held for ever: per-session limits on its connections.

A worker stopped inside a transaction (SIGSTOP, a node swapping, a suspended job, NFS, a
debugger) holds its row locks until it wakes, and every other worker waits on them: the
lease cannot help, since the lease is written in a transaction that waits too. So each connection
autotune opens gets limits of its own, set when it connects (``SET``: no server
configuration is needed, and a pooler in session mode passes them on):

============  ==============================================  =====================
backend       limit                                           value
============  ==============================================  =====================
PostgreSQL    ``idle_in_transaction_session_timeout``         T (the server ends the
                                                              session; its locks go)
PostgreSQL    ``lock_timeout``, ``statement_timeout``         2 T
MariaDB       ``idle_transaction_timeout`` (10.3+)            T
MariaDB       ``innodb_lock_wait_timeout``,                   2 T
              ``max_statement_time``
MySQL         ``wait_timeout`` (no idle-transaction limit)    max(T, 60 s)
MySQL         ``innodb_lock_wait_timeout``,                   2 T
              ``max_execution_time`` (reads)
SQLite        the busy timeout (a lock cannot be taken from   T
              a live process: the waiter says so, retries)
============  ==============================================  =====================

with T = ``storage.transaction_timeout_s``. A transaction of autotune's lasts
milliseconds; one idle for T is a frozen process. Its session ended, the waiters go on,
and a woken worker finds its connection closed: the transaction it was in never
committed (a claim it was making is not made), and it retries from the start
(:mod:`autotune.storage.transient`). PostgreSQL's settings: "Client Connection Defaults"
of its manual (``idle_in_transaction_session_timeout`` since 9.6); MariaDB's
``idle_transaction_timeout``: "Server System Variables" (since 10.3).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["session_statements", "apply_session_limits", "MYSQL_MIN_WAIT_S"]

MYSQL_MIN_WAIT_S = 60
"""MySQL's ``wait_timeout`` also ends a connection idle between transactions: not lower
than this, so that a pooled connection is not closed under a worker thinking a while."""


def session_statements(backend: str, timeout_s: int, *, mariadb: bool = False) -> list[str]:
    """The ``SET`` statements of one connection (none for SQLite: see ``engine_kwargs``).

    >>> session_statements("postgresql", 30)[0]
    'SET idle_in_transaction_session_timeout = 30000'
    >>> session_statements("mysql", 30, mariadb=True)[0]
    'SET SESSION idle_transaction_timeout = 30'
    """
    ms = 1000 * timeout_s
    if backend == "postgresql":
        return [f"SET idle_in_transaction_session_timeout = {ms}",
                f"SET lock_timeout = {2 * ms}", f"SET statement_timeout = {2 * ms}"]
    if backend == "mysql" and mariadb:
        return [f"SET SESSION idle_transaction_timeout = {timeout_s}",
                f"SET SESSION innodb_lock_wait_timeout = {2 * timeout_s}",
                f"SET SESSION max_statement_time = {2 * timeout_s}"]
    if backend == "mysql":
        return [f"SET SESSION wait_timeout = {max(timeout_s, MYSQL_MIN_WAIT_S)}",
                f"SET SESSION innodb_lock_wait_timeout = {2 * timeout_s}",
                f"SET SESSION max_execution_time = {2 * ms}"]
    return []


def apply_session_limits(engine: Engine, backend: str, timeout_s: int) -> None:
    """Set the limits on every connection ``engine`` opens from now on (and drop the ones
    it opened before: they are opened again, with them)."""
    if backend not in ("postgresql", "mysql"):
        return

    @event.listens_for(engine, "connect")
    def _limits(dbapi_conn: Any, record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            mariadb = False
            if backend == "mysql":
                cur.execute("SELECT VERSION()")
                mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
            for statement in session_statements(backend, timeout_s, mariadb=mariadb):
                cur.execute(statement)
        finally:
            cur.close()
        # psycopg runs the SETs in a transaction: a rollback would undo them.
        dbapi_conn.commit()

    engine.dispose()
