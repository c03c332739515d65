"""Database failures that pass: which they are, and waiting them out with one line each.

A cluster's database has bad days: it restarts (``pg_ctl restart -m immediate`` answers
"the database system is not yet accepting connections" for a moment, then "connection
refused"), it is full ("too many clients"), it ends a session (an administrator, or
autotune's own ``idle_in_transaction_session_timeout``: :mod:`autotune.storage.limits`),
it refuses a transaction it cannot serialize, or SQLite's writer lock is held by another
process. Each is worth waiting for: :func:`retrying` runs a storage call again with
back-off, printing one line per wait, and after ``storage.outage_wait_s`` raises one
:class:`~autotune.errors.StorageError` that says what happened (the CLI prints it as one
line, exit code 1): a worker ended by a restart it could have waited out would throw
away the results it had measured.

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

__all__ = ["transient_reason", "retrying", "driver_message", "error_code", "Outage",
           "BACKOFF_START_S", "BACKOFF_MAX_S"]

T = TypeVar("T")

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 16.0
"""Waits double from 0.5 s to 16 s, jittered (x0.5-1.5): 64 workers that lost one server
at once do not all knock again at the same instant."""

# By code where the driver gives one. PostgreSQL's SQLSTATEs ("PostgreSQL Error Codes",
# appendix A of its manual; psycopg 3 gives them as ``err.sqlstate``, psycopg 2 as
# ``pgcode``), so that a server with a localised ``lc_messages`` is read the same.
_CLOSED = "closed the connection"
_FULL = "full (too many connections)"
_RECOVERY = "in crash recovery"
_IDLE = ("ended this worker's transaction, idle past storage.transaction_timeout_s (was "
         "this process stopped?): its locks and anything it had not committed are gone")
_LOCK = "held a lock past the lock timeout"
_STATEMENT = "ran a statement past its timeout"
_DEADLOCK = "broke a deadlock"
_SQLSTATE = {
    "08000": _CLOSED,  # connection_exception
    "08003": _CLOSED,  # connection_does_not_exist
    "08006": _CLOSED,  # connection_failure
    "57P01": _CLOSED,  # admin_shutdown (pg_terminate_backend, a fast shutdown)
    "57P02": _CLOSED,  # crash_shutdown
    "57P03": _RECOVERY,  # cannot_connect_now: starting up, in recovery
    "53300": _FULL,  # too_many_connections
    "40001": "refused a transaction it could not serialize",  # serialization_failure
    "40P01": _DEADLOCK,  # deadlock_detected
    "55P03": _LOCK,  # lock_not_available (lock_timeout)
    "57014": _STATEMENT,  # query_canceled (statement_timeout)
    "25P03": _IDLE,  # idle_in_transaction_session_timeout, which autotune sets
}
# MySQL/MariaDB error numbers (the first of the driver error's ``args``; MySQL's "Server
# Error Message Reference" and "Client Error Message Reference", MariaDB's error codes).
_MYSQL_ERRNO = {
    1040: _FULL,  # ER_CON_COUNT_ERROR
    1053: _CLOSED,  # ER_SERVER_SHUTDOWN
    1205: _LOCK,  # ER_LOCK_WAIT_TIMEOUT
    1213: _DEADLOCK,  # ER_LOCK_DEADLOCK
    1927: _CLOSED,  # MariaDB ER_CONNECTION_KILLED
    1969: _STATEMENT,  # MariaDB ER_STATEMENT_TIMEOUT (max_statement_time)
    3024: _STATEMENT,  # MySQL ER_QUERY_TIMEOUT (max_execution_time)
    4031: _CLOSED,  # MySQL ER_CLIENT_INTERACTION_TIMEOUT (wait_timeout)
    2006: _CLOSED,  # CR_SERVER_GONE_ERROR
    2013: _CLOSED,  # CR_SERVER_LOST
}
_MYSQL_REFUSED = {2002, 2003}  # CR_CONNECTION_ERROR, CR_CONN_HOST_ERROR
_REFUSED_WHY = "refused the connection (down or restarting)"

# By text only where no code exists (lower-cased fragments -> what a person is told):
# - a failed connection: libpq reports a refusal at connect time (the server starting up,
#   full, shutting down) as a message without a SQLSTATE (psycopg: "connection failed:");
# - a connection lost on the client's side (no server reply to carry a code: psycopg's
#   "consuming input failed", a reset, a broken pipe; a session the server ended between
#   statements arrives this way too);
# - SQLite's lock, which its driver reports by message only.
# PostgreSQL's texts are from src/backend/utils/init/postinit.c and tcop/postgres.c.
_CONNECT_TEXT = {
    "too many clients": _FULL,
    "remaining connection slots": _FULL,
    "the database system is starting up": "starting up",
    "the database system is not yet accepting connections": _RECOVERY,
    "the database system is in recovery mode": _RECOVERY,
    "the database system is shutting down": "shutting down",
}
_CLIENT_TEXT = {
    "server closed the connection unexpectedly": _CLOSED,
    "terminating connection due to administrator command": _CLOSED,
    "terminating connection due to idle-in-transaction timeout": _IDLE,
    "consuming input failed": _CLOSED,
    # psycopg 3 when the socket went away under a wait (psycopg/waiting.py, 3.3.9: an
    # OSError, or os.fstat failing on the descriptor): a worker saw it once in 8 on an
    # immediate server restart (tests/faults/test_database_faults.py).
    "connection socket closed": _CLOSED,
    "connection is closed": _CLOSED,
    "connection already closed": _CLOSED,
    "the connection is lost": _CLOSED,
    "ssl connection has been closed": _CLOSED,
    "connection reset": _CLOSED,
    "broken pipe": _CLOSED,
}
_SQLITE_TEXT = {
    "database is locked": "is locked by another process for longer than "
                          "storage.transaction_timeout_s (a stopped or frozen worker?)",
    "database table is locked": "is locked by another process",
}
_ALWAYS = {**_CONNECT_TEXT, **_CLIENT_TEXT, **_SQLITE_TEXT}
_REFUSED_TEXT = ("connection refused", "can't connect to mysql server")


def error_code(err: BaseException) -> str | int | None:
    """The driver's code of ``err`` (or of the driver error SQLAlchemy wraps): a
    PostgreSQL SQLSTATE (``str``) or a MySQL error number (``int``); ``None`` if none."""
    orig = getattr(err, "orig", None) or err
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(code, str):
        return code
    args = getattr(orig, "args", ())
    if type(orig).__module__.startswith(("pymysql", "MySQLdb")) and args \
            and isinstance(args[0], int):
        return args[0]
    return None


def transient_reason(err: BaseException, *, connected: bool = True) -> str | None:
    """Why ``err`` (or what caused it: Optuna wraps the driver's error in a
    ``StorageInternalError`` of its own words) is a failure worth waiting out, in a few
    words; ``None`` if it is not one.

    Decided by the driver's code where an error in the chain has one (a code not listed
    is not transient, whatever its text says), by its text only where none has.
    ``connected``: whether this process reached the database before. A refused
    connection before that is most often a wrong host or port, and fails at once; after
    it, a server that went down and is coming back.
    """
    chain = _causes(err)
    for link in chain:
        code = error_code(link)
        if code is None:
            continue
        if code in _MYSQL_REFUSED:
            return _REFUSED_WHY if connected else None
        return _SQLSTATE.get(code) if isinstance(code, str) else _MYSQL_ERRNO.get(code)
    for link in chain:
        text = str(getattr(link, "orig", None) or link).lower()
        for fragment, why in _ALWAYS.items():
            if fragment in text:
                return why
        if connected and any(fragment in text for fragment in _REFUSED_TEXT):
            return _REFUSED_WHY
        if connected and getattr(link, "connection_invalidated", False):
            return _CLOSED  # SQLAlchemy's own flag for a connection it saw die
    return None


def _causes(err: BaseException) -> list[BaseException]:
    """``err`` and what caused it, nearest first: the ``__cause__`` of a ``raise ... from``
    (SQLAlchemy's and Optuna's wrappers), and the ``__context__`` of a ``raise ... from None``
    (autotune's translations), never an unsuppressed ``__context__``: that is an earlier
    failure the code had handled when this one happened, not its cause. Optuna's
    ``create_study`` looks the study up after a ``DuplicatedStudyError`` (another worker
    created it first), so a dropped connection there carried the handled unique violation
    (23505, not transient) as its context, and was not waited out (CI: 1 of 6 workers
    exited 1 while its database's sessions were being terminated)."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or (seen.__context__ if seen.__suppress_context__ else None)
    return chain


def driver_message(err: BaseException) -> str:
    """The database driver's own words under ``err``: Optuna's ``StorageInternalError``
    says only "An exception is raised during the commit" and SQLAlchemy's errors add the
    SQL; what a person needs is the driver's message ("database or disk is full")."""
    for link in _causes(err):
        orig = getattr(link, "orig", None)
        if orig is not None:
            return str(orig)
    return str(err) or type(err).__name__


def _say(line: str) -> None:
    print(f"autotune: {line}", file=sys.stderr, flush=True)


class Outage:
    """The waits of one outage over every call of a storage (shared by its threads): a
    give-up line counts all of them, not only its own call's. Over once a call passes."""

    def __init__(self) -> None:
        self.waits = 0

    def passed(self) -> None:
        self.waits = 0


def retrying(what: str, where: str, fn: Callable[[], T], *, wait_s: float,
             connected: Callable[[], bool] = lambda: True,
             translate: Callable[[BaseException], BaseException | None] = lambda e: None,
             sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic,
             outage: Outage | None = None) -> T:
    """``fn()``, run again while it fails transiently (:func:`transient_reason`), for up
    to ``wait_s`` seconds (and once at least), with one line on stderr per wait; then a
    :class:`StorageError` naming the database (``where``, masked), what it did, how long
    it was waited for and how many waits the outage took (``outage``: the storage's count
    over all its calls; default this call's).

    ``fn`` must be one transaction or one read, so that running it again is safe.
    ``translate`` turns a non-transient error into the one to raise (``None``: raise it
    as it is). ``sleep`` and ``clock`` are injectable for tests.
    """
    outage = outage or Outage()
    delay, started, waits = BACKOFF_START_S, clock(), 0
    while True:
        try:
            result = fn()
            outage.passed()
            return result
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
                    f"{waited:.0f} s and {outage.waits} retries in all "
                    f"(storage.outage_wait_s={wait_s:g}). Nothing half-written is left: run "
                    "the study again once the database is back, and it resumes") from None
            pause = min(delay * (0.5 + random.random()), max(0.05, wait_s - waited))
            waits += 1
            outage.waits += 1
            _say(f"{what}: the database {where} {why}; retry {waits} in {pause:.1f} s "
                 f"(waiting up to {wait_s:g} s)")
            sleep(pause)
            delay = min(delay * 2, BACKOFF_MAX_S)
