"""A plain SQLite URL is read without SQLAlchemy, and read as SQLAlchemy reads it.

``autotune/config/sqlite_file.py`` parses ``sqlite[+driver]:///PATH`` itself so that
loading a study file (``plan`` on a study that has not run) imports no part of the
database layer (#32: ``plan`` under 2 s of CPU time). Each URL below is checked against
SQLAlchemy's own parsing and rendering, the code it replaces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from autotune.config.sqlite_file import _database, _plain_sqlite, next_to, sqlite_path

URLS = [
    "sqlite:///autotune.db",
    "sqlite:///../autotune-lrz.db",
    "sqlite:////tmp/a.db",
    "sqlite+pysqlite:///runs/x.db",
    "sqlite:///dir with space/a+b.db",
    "sqlite:///a:b@c#d.db",
    "sqlite:///",
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite:///file:x.db?mode=ro&uri=true",
    "sqlite:///a.db?timeout=5",
    "sqlite:///a%20b.db",
    "sqlite:////tmp/%41.db",
    "sqlite://localhost/a.db",
    "postgresql://u:p@127.0.0.1:5432/test",
]


def _sqlalchemy_database(url: str) -> str | None:
    try:
        return make_url(url).database
    except ArgumentError:
        return None


def _sqlalchemy_next_to(url: str, base_dir: str) -> str:
    """What ``next_to`` returned when SQLAlchemy rendered every URL."""
    path = sqlite_path(url)  # its database part: SQLAlchemy's (the test above)
    if path is None or path.is_absolute():
        return url
    absolute = str((Path(base_dir) / path).resolve())
    return make_url(url).set(database=absolute).render_as_string(hide_password=False)


@pytest.mark.parametrize("url", URLS)
def test_same_database_as_sqlalchemy(url: str) -> None:
    assert _database(url) == _sqlalchemy_database(url)


def test_the_file_of_each_kind_of_url() -> None:
    assert sqlite_path("sqlite:///a.db") == Path("a.db")
    assert sqlite_path("sqlite:///a%20b.db?timeout=5") == Path("a b.db")
    assert [sqlite_path(u) for u in ("sqlite://", "sqlite:///:memory:", "sqlite:///",
                                     "sqlite:///file:x.db?uri=true", "sqlite:///${D}/a.db",
                                     "postgresql://h/test")] == [None] * 6


@pytest.mark.parametrize("base", ["/work/studies", "/tmp/a b/c:d", "/tmp/x%y", "/tmp/q?r"])
@pytest.mark.parametrize("url", URLS)
def test_same_url_next_to_the_study(url: str, base: str) -> None:
    assert next_to(url, base) == _sqlalchemy_next_to(url, base)


def test_only_plain_urls_take_the_fast_path() -> None:
    plain = [u for u in URLS if _plain_sqlite(u) is not None]
    assert plain == [*URLS[:7], "sqlite:///:memory:"]
    for url in plain:  # the drivername and database SQLAlchemy gives
        parsed = make_url(url)
        assert _plain_sqlite(url) == (parsed.drivername, parsed.database)


def test_loading_a_study_imports_no_database_layer(tmp_path: Path) -> None:
    """The reason for the fast path: a study file with a SQLite URL loads without
    SQLAlchemy (a third of ``plan``'s CPU time on a study that has not run)."""
    study = Path(__file__).resolve().parents[2] / "studies" / "lrz_gpt175b.yaml"
    code = ("import sys; from autotune.spec import load_study; "
            f"s = load_study({str(study)!r}); "
            "print(s.storage.url); print(sorted(m for m in sys.modules if "
            "m.split('.')[0] in ('sqlalchemy', 'alembic', 'optuna')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.splitlines()
    assert out[0] == "sqlite:///" + str(study.parent.parent / "autotune-lrz.db")
    assert out[1] == "[]"
