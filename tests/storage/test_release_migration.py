"""A database written by the previous release (schema 3, ``tests/storage/data``) opened by
this one: every migration step since runs on real data, nothing is lost, and the studies
stay readable by ``status``."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy import create_engine, inspect, text

from autotune.config.study import StorageConfig
from autotune.storage.db import Storage
from autotune.storage.schema import ENERGY_COLUMNS, SCHEMA_VERSION
from tests.helpers import run_cli

RELEASE_DB = Path(__file__).parent / "data" / "v3_release.db"


def _rows(url: str) -> list[tuple[str, str, str, str]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("select study_name, launcher, workload, outcome from "
                                 "measurements order by id")).all()
    engine.dispose()
    return [tuple(r) for r in rows]


def test_the_previous_release_s_database_is_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copy(RELEASE_DB, db)
    url = f"sqlite:///{db}"
    before = _rows(url)
    # What that release stored: its command study's rows labelled as the built-in trainer.
    assert [r[2] for r in before if r[0] == "own-program"] == ["builtin", "builtin"]
    Storage(StorageConfig(url=url)).close()
    after = _rows(url)
    assert [(s, la, o) for s, la, _, o in after] == [(s, la, o) for s, la, _, o in before]
    assert {r[2] for r in after if r[0] == "own-program"} == {"command"}
    assert {r[2] for r in after if r[0] == "replayed"} == {"replay"}
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("select max(version) from autotune_schema")).scalar() \
            == SCHEMA_VERSION
        columns = {c["name"] for c in inspect(conn).get_columns("measurements")}
        assert {name for name, _ in ENERGY_COLUMNS} <= columns
        # v7: the confirmation round's tables, empty (no round ran then).
        assert {"confirmations", "confirmation_runs"} <= set(inspect(conn).get_table_names())
        assert conn.execute(text("select count(*) from confirmation_runs")).scalar() == 0
        # v8: which models predicted a row; not recorded then (NULL: kept by the warm start).
        assert "model_version" in columns
        assert conn.execute(text("select count(*) from measurements where "
                                 "model_version is not null")).scalar() == 0
        # Never measured then: NULL, not 0.
        assert conn.execute(text("select count(*) from measurements where "
                                 "energy_j_per_step is not null")).scalar() == 0
    engine.dispose()
    # A second open is a no-op, and the migrated studies read as before.
    Storage(StorageConfig(url=url)).close()
    assert _rows(url) == after
    status = run_cli("status", "--storage", url, timeout=300)
    assert status.returncode == 0, status.stderr
    assert "own-program" in status.stdout and "replayed" in status.stdout
    assert "Traceback" not in status.stdout + status.stderr
