"""Opening the shared database: Optuna's RDB storage plus autotune's tables.

One :class:`Storage` per process holds one SQLAlchemy engine for autotune's tables and
Optuna's :class:`~optuna.storages.RDBStorage` on the same URL. :meth:`Storage.session`
is the one session scope: it commits, rolls back, and translates database errors into
:class:`~autotune.errors.StorageError` with the password masked (Optuna's
``_create_scoped_session`` pattern). :meth:`Storage.retrying` waits out a database that
fails transiently (:mod:`autotune.storage.transient`); ``Storage.optuna``, the storage every
``optuna.Study`` is opened on, does the same for each of Optuna's calls
(:mod:`autotune.storage.guarded`); each connection carries its own transaction limits
(:mod:`autotune.storage.limits`).
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import optuna
from alembic.runtime.migration import MigrationContext
from optuna.storages import BaseStorage
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from autotune.config.study import StorageConfig
from autotune.errors import AutotuneError, StorageError
from autotune.storage._sp_columns import widen_recompute_add_sequence_parallel
from autotune.storage.engine import _no_pool, _sqlite_immediate, engine_kwargs
from autotune.storage.guarded import database_error, guard, one_line
from autotune.storage.limits import apply_session_limits
from autotune.storage.optuna_pin import check_optuna_version
from autotune.storage.optuna_schema import first_start_turn, head_revision
from autotune.storage.reads import MeasurementReads
from autotune.storage.schema import (
    ENERGY_COLUMNS,
    SCHEMA_VERSION,
    Base,
    Confirmation,
    ConfirmationRun,
    SchemaVersion,
)
from autotune.storage.transient import Outage, retrying
from autotune.storage.turns import Turns
from autotune.storage.urls import backend_of, mask_url, resolve_url

__all__ = ["Storage", "open_storage", "engine_kwargs"]

T = TypeVar("T")

_SCHEMA_ATTEMPTS = 8


class Storage(MeasurementReads):
    """The study storage and the measurements tables of one database."""

    def __init__(self, config: StorageConfig, *, connections: int = 1) -> None:
        check_optuna_version()
        self.config = config
        self.connections = connections
        self.url = resolve_url(config.url)
        self.masked_url = mask_url(self.url)
        self.backend = backend_of(self.url)
        self._connected = False
        self._outage = Outage()
        """Whether this process reached the database: a refused connection is a restart
        then, not a wrong URL (:func:`autotune.storage.transient.transient_reason`)."""
        for attempt in range(_SCHEMA_ATTEMPTS):
            try:
                # Once the probe reached the server, a refused connection later in the
                # opening is a restart, waited out; before, a wrong URL (fails at once).
                retrying("opening the study database", self.masked_url, self._open,
                         wait_s=config.outage_wait_s, connected=lambda: self._connected)
                self._connected = True
                break
            except AutotuneError:
                raise
            except (SQLAlchemyError, OSError, ValueError, ImportError) as err:
                # Workers started together race to create the tables of a new database;
                # the loser sees "already exists" (or a lock) and simply tries again.
                text = str(err).lower()
                racing = any(t in text for t in ("already exists", "locked", "duplicate",
                                                 "unique constraint"))
                if racing and attempt + 1 < _SCHEMA_ATTEMPTS:
                    time.sleep(0.2 + random.random())
                    continue
                raise StorageError(f"cannot open the database {self.masked_url}: "
                                   f"{_short(err, self.url)}") from None

    def _open(self) -> None:
        kwargs = engine_kwargs(self.url, self.connections,
                               busy_timeout_s=self.config.transaction_timeout_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            stamped = self._optuna_revision(kwargs)
            if stamped is None:
                stamped = self._first_start(kwargs)
            # No Optuna heartbeats: a trial's liveness is its claim's lease
            # (autotune.storage.claims), written in autotune's own transactions.
            self.rdb = optuna.storages.RDBStorage(
                self.url, engine_kwargs=kwargs, skip_table_creation=True,
                skip_compatibility_check=True)  # checked below, one connection at a time
        self._check_optuna_schema(stamped)
        # One engine (one pool) for Optuna's tables and autotune's: a worker holds at most
        # engine_kwargs' connections, whichever table it reads.
        self.engine: Engine = self.rdb.engine
        if self.backend == "sqlite":
            _sqlite_immediate(self.engine)
        apply_session_limits(self.engine, self.backend, self.config.transaction_timeout_s)
        # What every optuna.Study of autotune's is opened on: Optuna's cached storage, each
        # call waited out and translated like autotune's own (autotune.storage.guarded).
        self._turns = Turns(self.connections)  # the pool's connections, first come first served
        self.optuna: BaseStorage = guard(optuna.storages.get_storage(self.rdb),
                                         self._optuna_call)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._create_schema()

    def _optuna_revision(self, kwargs: dict[str, Any]) -> str | None:
        """The alembic revision an earlier start stamped Optuna's tables with (``None``: not
        created yet), asked on one connection of its own, closed at once."""
        probe = create_engine(self.url, **_no_pool(kwargs), poolclass=NullPool)
        try:
            with probe.connect() as connection:
                self._connected = True  # the server is there: see __init__
                return _stamped(connection)
        finally:
            probe.dispose()

    def _first_start(self, kwargs: dict[str, Any]) -> str | None:
        """Create a new database's tables, Optuna's and autotune's, one worker at a time
        (:func:`~autotune.storage.optuna_schema.first_start_turn`): a worker that waited
        finds them made. Returns the revision found after waiting (``None``: created now).

        Optuna's first start creates its tables and stamps their alembic revision, asking
        for a connection while it holds one (optuna 5.0, ``_VersionManager._init_alembic``
        -> ``_is_alembic_supported``): done on connections of its own, closed at once,
        never on the worker's pool; the creator holds those two and its lock's, the
        waiters one each."""
        lock = create_engine(self.url, **_no_pool(kwargs), poolclass=NullPool)
        try:
            with lock.connect() as connection, first_start_turn(
                    connection, self.backend, self.config.transaction_timeout_s):
                stamped = _stamped(connection)
                connection.commit()
                if stamped is not None:
                    return stamped
                optuna.storages.RDBStorage(
                    self.url, engine_kwargs={**_no_pool(kwargs), "poolclass": NullPool}
                ).engine.dispose()
                Base.metadata.create_all(connection)
                connection.commit()
                return None
        finally:
            lock.dispose()

    def _check_optuna_schema(self, stamped: str | None) -> None:
        """Optuna's own start-up check, one connection at a time.

        ``RDBStorage``'s ``check_table_schema_compatibility`` (optuna 5.0,
        ``optuna/storages/_rdb/storage.py``) reads the stored version inside an open session
        and then asks alembic for the current revision on a second connection: with a pool
        of one that second connection would wait for the first. The same comparison and
        the same advice; the head is read from Optuna's scripts' text
        (:func:`~autotune.storage.optuna_schema.head_revision`, alembic's answer where
        that finds none). ``stamped``: the revision the probe read (``None``: the tables
        were created just now, and are read again)."""
        current = stamped if stamped is not None else self.rdb.get_current_version()
        head = head_revision() or self.rdb.get_head_version()
        if current == head:
            return
        advice = ("run `optuna storage upgrade --storage URL` to upgrade the tables"
                  if current in self.rdb.get_all_versions()
                  else "upgrade optuna (pip install -U optuna)")
        raise StorageError(
            f"the database {self.masked_url} has Optuna's table schema {current}, and this "
            f"optuna {optuna.__version__} reads {head}: {advice}")

    def _create_schema(self) -> None:
        Base.metadata.create_all(self.engine)
        try:
            with self.session() as s:
                found = s.scalar(select(func.max(SchemaVersion.version)))
                if found is None:
                    s.add(SchemaVersion(version=SCHEMA_VERSION))
        except StorageError as err:
            if not _is_unique_violation(err):
                raise
            found = SCHEMA_VERSION  # a worker starting at the same moment recorded it
        if found is not None and found > SCHEMA_VERSION:
            raise StorageError(
                f"the database {self.masked_url} has autotune schema v{found}, newer than "
                f"this autotune (v{SCHEMA_VERSION}): upgrade autotune")
        if found is not None and found < SCHEMA_VERSION:
            self._migrate(found)

    def _migrate(self, found: int) -> None:
        """Bring a database of schema ``found`` up to :data:`SCHEMA_VERSION`, one step per
        version (the history is :mod:`autotune.storage.schema`'s docstring). Each step
        checks what exists first: workers opening one database at once may race through
        it (the loser's "already exists" is retried by the caller)."""
        if found < 2:
            columns = {c["name"] for c in inspect(self.engine).get_columns("measurements")}
            if "workload" not in columns:
                with self.engine.begin() as conn:
                    conn.execute(text("ALTER TABLE measurements ADD COLUMN workload "
                                      "VARCHAR(64) NOT NULL DEFAULT 'builtin'"))
                    conn.execute(text("UPDATE measurements SET workload = 'replay' "
                                      "WHERE launcher = 'replay'"))
        if found < 3:
            columns = {c["name"] for c in inspect(self.engine).get_columns("layout_claims")}
            with self.engine.begin() as conn:
                for name, ddl in (("lease_until", "TIMESTAMP NULL"),
                                  ("attempts", "INTEGER NOT NULL DEFAULT 1"),
                                  ("retry", "INTEGER NOT NULL DEFAULT 0")):
                    if name not in columns:
                        conn.execute(text(f"ALTER TABLE layout_claims ADD COLUMN {name} {ddl}"))
                # Version 2 passed a claim on when its trial failed unjudged (stale),
                # interrupted or on a dead node: those wait for a retry now.
                conn.execute(text(
                    "UPDATE layout_claims SET retry = 1 WHERE trial_id IN (SELECT t.trial_id "
                    "FROM trials t WHERE t.state = 'FAIL' AND NOT EXISTS (SELECT 1 FROM "
                    "trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key = "
                    "'outcome' AND a.value_json NOT IN ('\"interrupted\"', '\"node_failure\"')))"))
        if found < 4:
            widen_recompute_add_sequence_parallel(self.engine)
        if found < 5:
            from autotune.storage.relabel import relabel_workloads

            with self.engine.begin() as conn:
                relabel_workloads(conn)
        if found < 6:
            columns = {c["name"] for c in inspect(self.engine).get_columns("measurements")}
            with self.engine.begin() as conn:
                for name, ddl in ENERGY_COLUMNS:
                    if name not in columns:  # NULL for older rows: not measured
                        conn.execute(text(f"ALTER TABLE measurements ADD COLUMN {name} {ddl}"))
        if found < 7:
            # New tables only: create_all above made them unless a racing worker's schema
            # check ran first; what exists is left alone.
            present = set(inspect(self.engine).get_table_names())
            missing = [Base.metadata.tables[t.__tablename__]
                       for t in (Confirmation, ConfirmationRun)
                       if t.__tablename__ not in present]
            if missing:
                Base.metadata.create_all(self.engine, tables=missing)
        if found < 8:
            columns = {c["name"] for c in inspect(self.engine).get_columns("measurements")}
            if "model_version" not in columns:  # NULL for older rows: kept, as before
                with self.engine.begin() as conn:
                    conn.execute(text("ALTER TABLE measurements ADD COLUMN model_version "
                                      "VARCHAR(32)"))
        try:
            with self.session() as s:
                s.add(SchemaVersion(version=SCHEMA_VERSION))
        except StorageError as err:
            if not _is_unique_violation(err):
                raise

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Commit on success, roll back on any error, translate database errors."""
        with self._turns.take(), self._session() as s:
            yield s

    @contextmanager
    def _session(self) -> Iterator[Session]:
        s = self._sessions()
        try:
            yield s
            s.commit()
        except SQLAlchemyError as err:
            _quiet_rollback(s)
            raise StorageError(f"database error on {self.masked_url}: {_short(err, self.url)}") \
                from None
        except BaseException:
            _quiet_rollback(s)
            raise
        finally:
            try:
                s.close()
            except SQLAlchemyError:
                pass  # a connection the server closed: the pool drops it

    def _optuna_call(self, what: str, fn: Callable[[], T]) -> T:
        """One Optuna storage call, waited out as :meth:`retrying` does, in its turn for
        the connection (:class:`autotune.storage.turns.Turns`)."""
        def in_turn() -> T:
            with self._turns.take():
                return fn()
        return self.retrying(what, in_turn)

    def retrying(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` (one transaction or one read), waited out while the database fails
        transiently, for up to ``storage.outage_wait_s``, one line per wait; any other
        database error as one :class:`StorageError` line."""
        return retrying(what, self.masked_url, fn, wait_s=self.config.outage_wait_s,
                        connected=lambda: self._connected, translate=self._translate,
                        outage=self._outage)

    def _translate(self, err: BaseException) -> BaseException | None:
        if database_error(err):
            return StorageError(f"database error on {self.masked_url}: "
                                f"{_short(err, self.url)}")
        return None

    def close(self) -> None:
        self.rdb.remove_session()
        self.engine.dispose()


def _stamped(connection: Connection) -> str | None:
    """The alembic revision Optuna's tables carry on ``connection``'s database (``None``:
    no tables yet)."""
    revision = MigrationContext.configure(connection).get_current_revision()
    return None if revision is None else str(revision)


def _quiet_rollback(s: Session) -> None:
    """Roll back; on a connection the server closed, the rollback fails too: the original
    error is the one to tell."""
    try:
        s.rollback()
    except SQLAlchemyError:
        pass


def _is_unique_violation(err: StorageError) -> bool:
    cause = err.__context__
    if isinstance(cause, IntegrityError):
        return True
    text = str(err)
    return any(t in text for t in ("UNIQUE", "unique", "Duplicate", "duplicate key"))


def open_storage(config: StorageConfig, *, connections: int = 1) -> Storage:
    """The study's storage; ``connections``: the trials this process runs side by side."""
    return Storage(config, connections=connections)


def _short(err: BaseException, url: str) -> str:
    """:func:`~autotune.storage.guarded.one_line` of a driver error, with this URL's
    password masked wherever it appears (not only inside URLs)."""
    text = one_line(err).replace(url, mask_url(url))
    try:
        from sqlalchemy.engine import make_url

        pw = make_url(url).password
        if pw:
            text = text.replace(str(pw), "***")
    except Exception:  # masking must never fail the error path
        pass
    return text
