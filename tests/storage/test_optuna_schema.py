"""Optuna's tables at a worker's start (issue 23): the head revision read from Optuna's
scripts is alembic's, and workers started together on a new database create its tables
once, one of them, the others waiting for it (PostgreSQL and MariaDB), where each of 64
used to run Optuna's creation and the losers retried it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.config.study import StorageConfig
from autotune.storage.db import open_storage
from autotune.storage.optuna_schema import head_revision, script_revisions
from tests.replay_study import own_mysql_database, own_pg_database


def test_the_head_read_from_optunas_scripts_is_alembics(tmp_path: Path) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert head_revision() == storage.get_head_version()


def test_scripts_that_are_not_plain_strings_are_left_to_alembic(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('revision = "a"\ndown_revision = None\n')
    (tmp_path / "b.py").write_text('"""b."""\nrevision = "b"\ndown_revision = "a"\n')
    (tmp_path / "c.py").write_text("revision: str = 'c'  # annotated\ndown_revision: "
                                   "str | None = 'b'\n")
    assert script_revisions(tmp_path) == {"a": None, "b": "a", "c": "b"}
    (tmp_path / "m.py").write_text('revision = "m"\ndown_revision = ("a", "b")\n')
    assert script_revisions(tmp_path) is None


def _open_together(url: str, monkeypatch: pytest.MonkeyPatch, n: int = 6) -> int:
    """Open ``url`` from ``n`` threads at once; how many ran Optuna's table creation."""
    creations = []

    class Counting(optuna.storages.RDBStorage):  # Optuna checks isinstance: a subclass
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not kwargs.get("skip_table_creation"):
                creations.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Counting)
    start, errors = threading.Barrier(n), []

    def worker() -> None:
        try:
            start.wait()
            open_storage(StorageConfig(url=url)).close()
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return len(creations)


@pytest.mark.postgres
def test_workers_started_together_on_postgresql_create_the_tables_once(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with own_pg_database(pg_url, "firststart") as url:
        assert _open_together(url, monkeypatch) == 1


@pytest.mark.slow  # as the other MariaDB tests: its server is not in every CI job
def test_workers_started_together_on_mariadb_create_the_tables_once(
        mysql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with own_mysql_database(mysql_url, "firststart") as url:
        assert _open_together(url, monkeypatch) == 1


@pytest.mark.parametrize("version", ["4.9.0", "5.2.0", "6.0.0.dev0", "nonsense"])
def test_an_optuna_outside_the_known_range_is_refused_in_one_line(
        version: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from autotune.errors import StorageError
    from autotune.storage.optuna_pin import KNOWN_TEXT, check_optuna_version

    with pytest.raises(StorageError) as err:
        check_optuna_version(version)
    assert len(str(err.value).splitlines()) == 1
    assert f"optuna {version} is installed" in str(err.value) and KNOWN_TEXT in str(err.value)
    monkeypatch.setattr(optuna, "__version__", version)
    with pytest.raises(StorageError):  # at the database's open
        open_storage(StorageConfig(url=f"sqlite:///{tmp_path / 'x.db'}"))
    assert not (tmp_path / "x.db").exists()


def test_the_installed_optuna_and_the_pyproject_pin_agree() -> None:
    from autotune.storage.optuna_pin import KNOWN_TEXT, check_optuna_version

    check_optuna_version()  # the installed one is in the range
    for ok in ("5.0.0", "5.1.0", "5.1.3"):
        check_optuna_version(ok)
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert f'"optuna{KNOWN_TEXT}"' in pyproject
