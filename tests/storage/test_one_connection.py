"""One connection per worker on a server (issue #23: with a second one allowed for a moment,
64 workers on 2 cores held 98 of PostgreSQL's default 100 and 34 of them found the server
full). Counted by the server itself (``pg_stat_activity``), on a database of the test's own:
the first start on a new database (Optuna creates and stamps its tables, holding two
connections for a moment besides the first-start lock's), a second start,
and a worker's two threads (its loop and a lease heartbeat) using the storage at once; and
Optuna's schema check, which autotune now makes itself, one connection at a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from autotune.config.study import StorageConfig
from autotune.storage.db import open_storage
from autotune.storage.schema import SchemaVersion
from tests.replay_study import own_pg_database


class _Peak:
    """The most connections to ``database`` seen, polled every 5 ms in a thread."""

    def __init__(self, admin_url: str, database: str) -> None:
        self.engine = create_engine(admin_url, pool_size=1, max_overflow=0)
        self.database, self.peak, self._stop = database, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                n = conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                      ":d AND pid <> pg_backend_pid()"),
                                 {"d": self.database}).scalar_one()
                self.peak = max(self.peak, int(n))
                conn.commit()
                time.sleep(0.005)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.engine.dispose()


@pytest.mark.postgres
def test_a_worker_holds_one_connection_from_its_first_start_on(pg_url: str) -> None:
    with own_pg_database(pg_url, "onecon") as url:
        database = make_url(url).database
        assert database is not None
        config = StorageConfig(url=url)
        with _Peak(pg_url, database) as first_start:
            storage = open_storage(config)  # creates Optuna's tables and autotune's
        storage.engine.dispose()
        # Optuna's first start runs on two connections of its own (closed at once) while the
        # first-start lock's connection waits for it (others that start now wait on that
        # lock, one connection each); the probe and the worker's pool come one after the
        # other
        assert first_start.peak <= 3, first_start.peak
        with _Peak(pg_url, database) as start:
            storage = open_storage(config)
        assert start.peak <= 1, start.peak

        stop = threading.Event()
        errors: list[BaseException] = []

        def beat() -> None:  # a heartbeat's transactions, as fast as they come
            try:
                while not stop.is_set():
                    with storage.session() as s:
                        s.scalar(select(SchemaVersion.version).limit(1))
            except BaseException as err:  # reported below
                errors.append(err)

        # Both threads ask back to back: with SQLAlchemy's pool alone the one that returns the
        # connection takes it back at once and the other waited out the pool's 300 s timeout
        # (CI, stop 28); autotune.storage.turns hands it over in order.
        with _Peak(pg_url, database) as both:
            thread = threading.Thread(target=beat)
            thread.start()
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:  # the loop's transactions beside it
                with storage.session() as s:
                    s.scalar(select(SchemaVersion.version).limit(1))
                storage.optuna.get_all_studies()
            stop.set()
            thread.join()
        storage.engine.dispose()
        assert not errors, errors
        assert both.peak == 1, both.peak


def test_tables_of_another_optuna_are_refused_with_optunas_advice(tmp_path: Path) -> None:
    # Optuna's own check is ours now (one connection at a time): a database whose tables an
    # older Optuna stamped gets the upgrade command, one a newer Optuna stamped the update.
    from autotune.errors import StorageError

    url = f"sqlite:///{tmp_path / 'old.db'}"
    open_storage(StorageConfig(url=url)).engine.dispose()
    raw = create_engine(url)
    for stamp, advice in (("v3.0.0.d", "optuna storage upgrade"),
                          ("v99.0.0.a", "pip install -U optuna")):
        with raw.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": stamp})
        with pytest.raises(StorageError, match=advice) as err:
            open_storage(StorageConfig(url=url))
        assert stamp in str(err.value)
    raw.dispose()
