"""Opening the shared database: Optuna's RDB storage plus autotune's tables.

One :class:`Storage` per process holds one SQLAlchemy engine for autotune's tables and
Optuna's :class:`~optuna.storages.RDBStorage` on the same URL. :meth:`Storage.session`
is the one session scope: it commits, rolls back, and translates database errors into
:class:`~autotune.errors.StorageError` with the password masked (Optuna's
``_create_scoped_session`` pattern).
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import optuna
from sqlalchemy import create_engine, delete, func, inspect, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from autotune.config.study import StorageConfig
from autotune.errors import AutotuneError, StorageError
from autotune.storage.schema import SCHEMA_VERSION, Base, LayoutClaim, Measurement, SchemaVersion
from autotune.storage.urls import backend_of, mask_url, resolve_url

__all__ = ["Storage", "ClaimResult", "open_storage", "engine_kwargs"]

_SCHEMA_ATTEMPTS = 8


def engine_kwargs(url: str) -> dict[str, Any]:
    """Engine options per backend. Many workers share one server, so each keeps a small
    pool and checks connections before use (a batch job may sit idle for hours)."""
    backend = backend_of(url)
    if backend == "sqlite":
        # Wait for the writer lock instead of failing at once under concurrent workers.
        return {"connect_args": {"timeout": 120}}
    return {"pool_size": 2, "max_overflow": 4, "pool_pre_ping": True, "pool_recycle": 1800}


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class ClaimResult(Enum):
    """What :meth:`Storage.claim` found."""

    CLAIMED = "claimed"
    """The trial owns the layout now (or already did): it may measure it."""
    TAKEN = "taken"
    """Another trial owns the layout (and may still measure it)."""
    OTHER_WORKER = "other-worker"
    """This very trial is claimed by another worker: SQLite can hand one waiting trial to
    two workers, and the other one runs it."""


class Storage:
    """The study storage and the measurements tables of one database."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.url = resolve_url(config.url)
        self.masked_url = mask_url(self.url)
        self.backend = backend_of(self.url)
        for attempt in range(_SCHEMA_ATTEMPTS):
            try:
                self._open()
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
        self.engine: Engine = create_engine(self.url, **engine_kwargs(self.url))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.optuna = optuna.storages.RDBStorage(
                self.url, engine_kwargs=engine_kwargs(self.url),
                heartbeat_interval=self.config.heartbeat_interval_s,
                grace_period=self.config.grace_period_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=3),
            )
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._create_schema()

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
        try:
            with self.session() as s:
                s.add(SchemaVersion(version=SCHEMA_VERSION))
        except StorageError as err:
            if not _is_unique_violation(err):
                raise

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Commit on success, roll back on any error, translate database errors."""
        s = self._sessions()
        try:
            yield s
            s.commit()
        except SQLAlchemyError as err:
            s.rollback()
            raise StorageError(f"database error on {self.masked_url}: {_short(err, self.url)}") \
                from None
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    # -- measurements -------------------------------------------------------------------

    def add_measurement(self, row: dict[str, Any]) -> None:
        with self.session() as s:
            s.add(Measurement(**row))

    def measurement_rows(self, columns: Sequence[str], *, device_type: str, dtype: str,
                         workload: str, outcomes: Sequence[str], study: str | None = None,
                         other_than: str | None = None,
                         limit: int | None = None) -> list[dict[str, Any]]:
        """``columns`` (and only those) of the measurements of one device type, dtype and
        workload with one of ``outcomes``, oldest first: of ``study`` alone, or of every
        study but ``other_than``; at most the ``limit`` most recent. One query, narrowed
        by the ``device_type`` (or ``study_name``) index."""
        try:
            selected = [getattr(Measurement, c) for c in columns]
        except AttributeError as err:
            raise ValueError(f"measurement_rows: no column {err.name!r}") from None
        query = select(*selected).where(
            Measurement.device_type == device_type, Measurement.dtype == dtype,
            Measurement.workload == workload, Measurement.outcome.in_(list(outcomes)))
        if study is not None:
            query = query.where(Measurement.study_name == study)
        if other_than is not None:
            query = query.where(Measurement.study_name != other_than)
        query = query.order_by(Measurement.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self.session() as s:
            rows = s.execute(query).all()
        return [dict(zip(columns, row, strict=True)) for row in reversed(rows)]

    # -- layout claims: each layout measured once per study, across workers ---------------

    def claim(self, study: str, key: str, trial_id: int, worker: str,
              *, may_take_over: Callable[[int], bool]) -> ClaimResult:
        """Make ``trial_id`` (run by ``worker``) the owner of layout ``key``.

        A claim held by a trial that can no longer measure (``may_take_over(owner)``: it
        failed stale or was interrupted) is taken over atomically: that is how a layout
        whose runner was killed is retried once. The loser of a race for the claim (or for
        its take-over) gets :attr:`ClaimResult.TAKEN`.
        """
        try:
            with self.session() as s:
                s.add(LayoutClaim(study_name=study, layout_key=key, trial_id=trial_id,
                                  worker=worker, created_at=_now()))
            return ClaimResult.CLAIMED
        except StorageError as err:
            if not _is_unique_violation(err):
                raise
        with self.session() as s:
            row = s.execute(select(LayoutClaim.trial_id, LayoutClaim.worker).where(
                LayoutClaim.study_name == study, LayoutClaim.layout_key == key)).first()
            if row is None:
                # Its owner released it after our insert failed (over the budget): the
                # layout was not free when this trial asked, so it is not this trial's.
                return ClaimResult.TAKEN
            owner, owner_worker = row
            if owner == trial_id:
                return ClaimResult.CLAIMED if owner_worker == worker else ClaimResult.OTHER_WORKER
            if not may_take_over(owner):
                return ClaimResult.TAKEN
            done = s.execute(update(LayoutClaim).where(
                LayoutClaim.study_name == study, LayoutClaim.layout_key == key,
                LayoutClaim.trial_id == owner).values(trial_id=trial_id, worker=worker))
            # Exactly one row changed: this worker won the take-over race.
            won = getattr(done, "rowcount", 0) == 1
            return ClaimResult.CLAIMED if won else ClaimResult.TAKEN

    def release(self, study: str, key: str, trial_id: int) -> None:
        with self.session() as s:
            s.execute(delete(LayoutClaim).where(
                LayoutClaim.study_name == study, LayoutClaim.layout_key == key,
                LayoutClaim.trial_id == trial_id))

    def claim_rank(self, study: str, key: str) -> int:
        """1-based position of this layout's claim among the study's claims (budget order)."""
        with self.session() as s:
            my_id = s.scalar(select(LayoutClaim.id).where(
                LayoutClaim.study_name == study, LayoutClaim.layout_key == key))
            if my_id is None:
                return 0
            return int(s.scalar(select(func.count()).select_from(LayoutClaim).where(
                LayoutClaim.study_name == study, LayoutClaim.id <= my_id)) or 0)

    def claimed_keys(self, study: str) -> dict[str, int]:
        with self.session() as s:
            rows = s.execute(select(LayoutClaim.layout_key, LayoutClaim.trial_id).where(
                LayoutClaim.study_name == study)).all()
        return {k: t for k, t in rows}

    def close(self) -> None:
        self.engine.dispose()
        self.optuna.remove_session()
        self.optuna.engine.dispose()


def _is_unique_violation(err: StorageError) -> bool:
    cause = err.__context__
    if isinstance(cause, IntegrityError):
        return True
    text = str(err)
    return any(t in text for t in ("UNIQUE", "unique", "Duplicate", "duplicate key"))


def open_storage(config: StorageConfig) -> Storage:
    return Storage(config)


def _short(err: BaseException, url: str) -> str:
    """First line of a driver error, with the password masked wherever it appears."""
    text = str(getattr(err, "orig", None) or err).strip().splitlines()[0] if str(err) else repr(err)
    masked = mask_url(url)
    text = text.replace(url, masked)
    try:
        from sqlalchemy.engine import make_url

        pw = make_url(url).password
        if pw:
            text = text.replace(str(pw), "***")
    except Exception:  # masking must never fail the error path
        pass
    return text[:500]
