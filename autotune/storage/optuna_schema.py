"""Optuna's tables on a study database: which schema revision they carry, which one this
Optuna reads, and the first start that creates them, one worker at a time.

Done plainly, this would be most of a worker's start's storage time. Two costs are cut:

- **This Optuna's head revision** is read from its migration scripts' source text
  (:func:`head_revision`). Alembic's ``ScriptDirectory``, which Optuna's
  ``get_head_version`` asks, executes each of the scripts to learn two strings, and the
  scripts declare SQLAlchemy models: ten of them in optuna 5.0, 0.1 CPU-s of a worker's
  start on this machine, paid by every worker.
- **A new database's tables are created by one worker while the others wait**
  (:func:`first_start_turn`): started together, all of them found no tables, all of them
  ran Optuna's creation, and the losers retried it after a pause (55 retries for 64
  workers), each time asking alembic for the head again.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["head_revision", "script_revisions", "single_head", "first_start_turn",
           "FIRST_START_LOCK"]

FIRST_START_LOCK = zlib.crc32(b"autotune: first start of a study database")
"""PostgreSQL's advisory lock key (a ``bigint``; advisory locks are per database)."""


_ASSIGNED = re.compile(r"^(revision|down_revision)\s*(?::[^=]+)?="  # an annotation or not
                       r"""\s*(?:None|(["'])([^"'\\]+)\2)\s*(?:\#.*)?$""", re.MULTILINE)
"""A module-level ``revision = "..."`` or ``down_revision = "..."`` / ``None`` (annotated or
not), as alembic's script template writes them."""


def script_revisions(versions: Path) -> dict[str, str | None] | None:
    """``revision -> down_revision`` of each alembic migration script in ``versions``, read
    from the scripts' text without running them; ``None`` where a script's two are not
    plain strings (a merge's tuple, a computed name): alembic must be asked then. (Not
    ``ast``: CPython 3.11's parser fails when two threads parse at once.)"""
    found: dict[str, str | None] = {}
    for script in sorted(versions.glob("*.py")):
        names: dict[str, str | None] = {}
        for match in _ASSIGNED.finditer(script.read_text(encoding="utf-8")):
            names.setdefault(match.group(1), match.group(3))
        if names.get("revision") is None or "down_revision" not in names:
            return None
        found[str(names["revision"])] = names["down_revision"]
    return found


def head_revision() -> str | None:
    """The revision of Optuna's table schema that the installed Optuna reads: the one
    migration script no other script revises (alembic's "head"), or ``None`` where its
    scripts are not one plain chain (a merge, a computed revision): ask alembic then.

    The scripts are Optuna's own (``optuna/storages/_rdb/alembic/versions``, the
    ``script_location`` its ``_VersionManager._create_alembic_config`` gives alembic);
    ``tests/storage/test_optuna_schema.py`` holds this to alembic's answer."""
    import optuna.storages._rdb as rdb

    revisions = script_revisions(Path(rdb.__file__).parent / "alembic" / "versions")
    return None if revisions is None else single_head(revisions)


def single_head(revisions: dict[str, str | None]) -> str | None:
    """The one revision no other revises, or ``None`` where there are none or several.

    >>> single_head({"a": None, "b": "a", "c": "b"})
    'c'
    >>> single_head({"a": None, "b": "a", "c": "a"}) is None
    True
    """
    revised = set(revisions.values())
    heads = [r for r in revisions if r not in revised]
    return heads[0] if len(heads) == 1 else None


@contextmanager
def first_start_turn(connection: Connection, backend: str, timeout_s: float) -> Iterator[bool]:
    """Hold the database's first-start lock on ``connection`` (a connection of its own, not
    the worker's pool): workers that found no tables create them one at a time, and each
    looks again once it has the lock. Yields whether the lock is held.

    PostgreSQL: a session-level advisory lock (``pg_advisory_lock``, "Advisory Lock
    Functions" of its manual), waited for at most ``timeout_s`` (``lock_timeout``);
    MySQL/MariaDB: ``GET_LOCK`` with that timeout. SQLite has one writer at a time anyway:
    no lock, and a racing creation is retried by the caller as before. A wait that runs
    out (a frozen creator) is no error: the worker then creates the tables itself, racing,
    and the caller retries what loses."""
    held = False
    try:
        if backend == "postgresql":
            connection.execute(text(f"SET lock_timeout = {int(1000 * timeout_s)}"))
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": FIRST_START_LOCK})
            held = True
        elif backend == "mysql":
            held = connection.execute(
                text("SELECT GET_LOCK(:name, :t)"),
                {"name": _mysql_lock(connection), "t": int(timeout_s)}).scalar() == 1
        connection.commit()  # the lock is the session's; no transaction is left open
    except SQLAlchemyError:
        connection.rollback()  # waited out: go on without it
    try:
        yield held
    finally:
        if held:
            _release(connection, backend)


def _release(connection: Connection, backend: str) -> None:
    """Give the first-start lock back (a connection the server lost has lost it already)."""
    try:
        if backend == "postgresql":
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": FIRST_START_LOCK})
        else:
            connection.execute(text("SELECT RELEASE_LOCK(:name)"),
                               {"name": _mysql_lock(connection)})
        connection.commit()
    except SQLAlchemyError:
        pass


def _mysql_lock(connection: Connection) -> str:
    """MySQL/MariaDB's lock name: ``GET_LOCK`` names are the server's, so the database's
    name is in it (at most 64 characters)."""
    return f"autotune-first-start:{connection.engine.url.database}"[:64]
