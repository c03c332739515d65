"""Schema v4 (issue 22): a v3 database is migrated: ``measurements.recompute`` holds
``selective`` (its ``VARCHAR(8)`` refused the 9 characters on PostgreSQL and MariaDB) and
``measurements.sequence_parallel`` exists, false for the rows written before it.

SQLite always; PostgreSQL and MariaDB each in a database of their own (created and dropped
here), since the step rewrites the ``measurements`` table."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from autotune.config.study import StorageConfig
from autotune.storage.db import Storage
from autotune.storage.schema import SCHEMA_VERSION
from tests.replay_study import own_mysql_database, own_pg_database
from tests.storage.test_calibration_rows import _row


def _make_v3(url: str) -> None:
    """A database as autotune v3 left it: ``recompute VARCHAR(8)``, no
    ``sequence_parallel``, version 3, one row measured with full recompute."""
    Storage(StorageConfig(url=url)).close()
    engine = create_engine(url)
    dialect = engine.dialect.name
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE measurements DROP COLUMN sequence_parallel"))
        if dialect == "postgresql":
            conn.execute(text("ALTER TABLE measurements ALTER COLUMN recompute TYPE VARCHAR(8)"))
        elif dialect == "mysql":
            conn.execute(text("ALTER TABLE measurements MODIFY recompute VARCHAR(8) NOT NULL"))
        conn.execute(text("DELETE FROM autotune_schema"))
        conn.execute(text("INSERT INTO autotune_schema (version) VALUES (3)"))
    row = _row("old", recompute="full")
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO measurements ({', '.join(row)}) VALUES "
                          f"({', '.join(':' + k for k in row)})"), row)
    engine.dispose()


def _check_migrated(url: str, *, width_enforced: bool) -> None:
    engine = create_engine(url)
    if width_enforced:  # what v3 could not store
        with pytest.raises(Exception), engine.begin() as conn:  # noqa: B017 (driver's own)
            conn.execute(text("UPDATE measurements SET recompute = 'selective'"))
    storage = Storage(StorageConfig(url=url))
    with engine.connect() as conn:
        assert conn.execute(text("select max(version) from autotune_schema")).scalar() \
            == SCHEMA_VERSION
        old = conn.execute(text("select recompute, sequence_parallel from measurements "
                                "where study_name = 'old'")).one()
        assert (old[0], bool(old[1])) == ("full", False)
    storage.add_measurement(_row("new", recompute="selective", sequence_parallel=True,
                                 layout_key="tp2-pp1-dp1-mb1-ga1-z0-selective-sp"))
    with engine.connect() as conn:
        new = conn.execute(text("select recompute, sequence_parallel, layout_key from "
                                "measurements where study_name = 'new'")).one()
    assert (new[0], bool(new[1]), new[2]) == ("selective", True,
                                              "tp2-pp1-dp1-mb1-ga1-z0-selective-sp")
    storage.close()
    Storage(StorageConfig(url=url)).close()  # a second open finds nothing left to do
    engine.dispose()


def test_a_v3_sqlite_database_is_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v3.db'}"
    _make_v3(url)
    _check_migrated(url, width_enforced=False)


@pytest.mark.postgres
def test_a_v3_postgresql_database_is_migrated(pg_url: str) -> None:
    with own_pg_database(pg_url, prefix="autotune_v4") as url:
        _make_v3(url)
        _check_migrated(url, width_enforced=True)


@pytest.mark.slow  # as the other MariaDB test: its server is not in every CI job
def test_a_v3_mariadb_database_is_migrated(mysql_url: str) -> None:
    with own_mysql_database(mysql_url, "autotune_v4") as url:
        _make_v3(url)
        _check_migrated(url, width_enforced=True)
