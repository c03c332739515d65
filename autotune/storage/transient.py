"""Database failures that pass: which they are, and waiting them out with one line each.

A cluster's database has bad days: it restarts (``pg_ctl restart -m immediate`` answers
"the database system is not yet accepting connections" for a moment, then "connection
refused"), it is full ("too many clients"), it ends a session (an administrator, or
autotune's own ``idle_in_transaction_session_timeout``: :mod:`autotune.storage.limits`),
it refuses a transaction it cannot serialize, or SQLite's writer lock is held by another
process. Each is worth waiting for: :func:`retrying` runs a storage call again with
back-off, printing one line per wait, and after ``storage.outage_wait_s`` raises one
:class:`~autotune.errors.StorageError` that says what happened (the CLI prints it as one
line, exit code 1). Issue 23 A/B: a worker ended by a restart it could have waited out
threw away the results it had measured.

Every storage call of a worker goes through here: autotune's own transactions
(``Storage.retrying``) and Optuna's (:mod:`autotune.storage.guarded`).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from autotune.errors import StorageError

__all__ = ["transient_reason", "retrying", "driver_message", "BACKOFF_START_S", "BACKOFF_MAX_S"]

T = TypeVar("T")

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 16.0
"""Waits double from 0.5 s to 16 s, jittered (x0.5-1.5): 64 workers that lost one server
at once do not all knock again at the same instant."""

# Lower-cased driver message fragments -> what a person is told. PostgreSQL's texts are
# from its src/backend/utils/init/postinit.c and src/backend/tcop/postgres.c
# (ProcessInterrupts: "terminating connection due to idle-in-transaction timeout",
# "canceling statement due to lock timeout"); psycopg 3 prefixes "connection failed:".
# MySQL/MariaDB: client errors 2002/2003/2006/2013, server errors 1040, 1205, 1213.
_BUSY = {
    "too many clients": "full (too many connections)",
    "too many connections": "full (too many connections)",
    "remaining connection slots": "full (too many connections)",
}
_RECOVERING = {
    "the database system is starting up": "starting up",
    "the database system is not yet accepting connections": "in crash recovery",
    "the database system is in recovery mode": "in crash recovery",
    "the database system is shutting down": "shutting down",
}
_CLOSED = {
    "server closed the connection unexpectedly": "closed the connection",
    "terminating connection due to administrator command": "closed the connection",
    "terminating connection due to idle-in-transaction timeout":
        "ended this worker's transaction, idle past storage.transaction_timeout_s (was "
        "this process stopped?): its locks and anything it had not committed are gone",
    "consuming input failed": "closed the connection",
    "connection is closed": "closed the connection",
    "connection already closed": "closed the connection",
    "the connection is lost": "closed the connection",
    "ssl connection has been closed": "closed the connection",
    "server has gone away": "closed the connection",
    "lost connection to": "closed the connection",
    "connection reset": "closed the connection",
    "broken pipe": "closed the connection",
}
_REFUSED = {
    "connection refused": "refused the connection (down or restarting)",
    "can't connect to mysql server": "refused the connection (down or restarting)",
}
_CONFLICT = {
    "could not serialize access": "refused a transaction it could not serialize",
    "deadlock detected": "broke a deadlock",
    "deadlock found": "broke a deadlock",
    "lock wait timeout exceeded": "held a lock past the lock timeout",
    "canceling statement due to lock timeout": "held a lock past the lock timeout",
    "canceling statement due to statement timeout": "ran a statement past its timeout",
    "query execution was interrupted": "ran a statement past its timeout",
    "database is locked": "is locked by another process for longer than "
                          "storage.transaction_timeout_s (a stopped or frozen worker?)",
    "database table is locked": "is locked by another process",
}
_ALWAYS = {**_BUSY, **_RECOVERING, **_CLOSED, **_CONFLICT}


def transient_reason(err: BaseException, *, connected: bool = True) -> str | None:
    """Why ``err`` (or what caused it: Optuna wraps the driver's error in a
    ``StorageInternalError`` of its own words) is a failure worth waiting out, in a few
    words; ``None`` if it is not one.

    ``connected``: whether this process reached the database before. A refused
    connection before that is most often a wrong host or port, and fails at once; after
    it, a server that went down and is coming back.
    """
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return None
        text = str(getattr(seen, "orig", None) or seen).lower()
        for table in (_ALWAYS, _REFUSED) if connected else (_ALWAYS,):
            for fragment, why in table.items():
                if fragment in text:
                    return why
        if connected and getattr(seen, "connection_invalidated", False):
            return "closed the connection"
        seen = seen.__cause__ or seen.__context__
    return None


def driver_message(err: BaseException) -> str:
    """The database driver's own words under ``err``: Optuna's ``StorageInternalError``
    says only "An exception is raised during the commit" and SQLAlchemy's errors add the
    SQL; what a person needs is the driver's message ("database or disk is full")."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            break
        orig = getattr(seen, "orig", None)
        if orig is not None:
            return str(orig)
        seen = seen.__cause__ or seen.__context__
    return str(err) or type(err).__name__


def _say(line: str) -> None:
    print(f"autotune: {line}", file=sys.stderr, flush=True)


def retrying(what: str, where: str, fn: Callable[[], T], *, wait_s: float,
             connected: Callable[[], bool] = lambda: True,
             translate: Callable[[BaseException], BaseException | None] = lambda e: None,
             sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> T:
    """``fn()``, run again while it fails transiently (:func:`transient_reason`), for up
    to ``wait_s`` seconds (and once at least), with one line on stderr per wait; then a
    :class:`StorageError` naming the database (``where``, masked), what it did and how
    long it was waited for.

    ``fn`` must be one transaction or one read, so that running it again is safe.
    ``translate`` turns a non-transient error into the one to raise (``None``: raise it
    as it is). ``sleep`` and ``clock`` are injectable for tests.
    """
    delay, started, waits = BACKOFF_START_S, clock(), 0
    while True:
        try:
            return fn()
        except Exception as err:
            why = transient_reason(err, connected=connected())
            if why is None:
                mapped = translate(err)
                if mapped is None:
                    raise
                raise mapped from None
            waited = clock() - started
            if waited >= wait_s and waits > 0:  # once at least: a blip is not an outage
                raise StorageError(
                    f"{what}: the database {where} {why}; gave up after waiting "
                    f"{waited:.0f} s and {waits} retries (storage.outage_wait_s={wait_s:g}). "
                    "Nothing half-written is left: run the study again once the database "
                    "is back, and it resumes") from None
            pause = min(delay * (0.5 + random.random()), max(0.05, wait_s - waited))
            waits += 1
            _say(f"{what}: the database {where} {why}; retry {waits} in {pause:.1f} s "
                 f"(waiting up to {wait_s:g} s)")
            sleep(pause)
            delay = min(delay * 2, BACKOFF_MAX_S)
