"""Where a SQLite storage URL's file is, and the two rules about it.

A study file's relative SQLite URL names a file next to the study file, not in whatever
folder the command runs from (:func:`next_to`): ``studies/x.yaml`` with
``sqlite:///x.db`` always means ``studies/x.db``. A command that only reads (``status``,
``best``, ``report``, ``dashboard``) refuses a SQLite file that does not exist
(:func:`require_existing`): opening it would create an empty database with the full schema
and then report that the study is not there, leaving the typo behind as a file.

>>> next_to("sqlite:///autotune.db", "/work/studies")
'sqlite:////work/studies/autotune.db'
>>> next_to("sqlite:////tmp/a.db", "/work/studies")
'sqlite:////tmp/a.db'

A plain SQLite URL (``sqlite[+driver]:///PATH``, no query, no %-escape) is read without
SQLAlchemy, as SQLAlchemy reads it (:func:`_plain_sqlite`): loading a study file (every
command, ``plan`` included) then imports no part of the database layer. Any other URL is
SQLAlchemy's to parse.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

from autotune.errors import UsageError

__all__ = ["ENV_VAR_RE", "sqlite_path", "next_to", "require_existing", "nothing_to_read"]

ENV_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A ``${VAR}`` in a storage URL, expanded from the environment when the URL is used."""
_PLAIN_SQLITE = re.compile(r"(sqlite(?:\+\w+)?)://(/[^?%]*)")
"""``sqlite[+driver]:///PATH`` without a query or a %-escape: SQLAlchemy's URL pattern
(``sqlalchemy/engine/url.py``, ``_parse_url``, 2.1) gives it no user, host or port, and
the database ``PATH`` as written (unquoting changes nothing without a ``%``)."""


def _plain_sqlite(url: str) -> tuple[str, str] | None:
    """``(drivername, database)`` of a plain SQLite URL (:data:`_PLAIN_SQLITE`), else
    ``None`` (SQLAlchemy parses it).

    >>> _plain_sqlite("sqlite:///a.db"), _plain_sqlite("sqlite+pysqlite:////t/a.db")
    (('sqlite', 'a.db'), ('sqlite+pysqlite', '/t/a.db'))
    >>> _plain_sqlite("sqlite:///a.db?mode=ro"), _plain_sqlite("sqlite://")
    (None, None)
    """
    m = _PLAIN_SQLITE.fullmatch(url)
    return None if m is None else (m.group(1), m.group(2)[1:])


def _database(url: str) -> str | None:
    """The database part of ``url`` as SQLAlchemy's ``make_url`` gives it (``None``: none,
    or an URL it cannot parse)."""
    plain = _plain_sqlite(url)
    if plain is not None:
        return plain[1]
    from sqlalchemy.engine import make_url  # local: a plain URL needs no SQLAlchemy
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).database
    except ArgumentError:
        return None


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite`` URL as written (``None``: not SQLite, in memory, or an
    URL with ``${VAR}`` still to expand)."""
    if not url.startswith("sqlite") or "${" in url:
        return None
    database = _database(url)
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def next_to(url: str, base_dir: str | Path) -> str:
    """``url`` with a relative SQLite file made absolute under ``base_dir``."""
    path = sqlite_path(url)
    if path is None or path.is_absolute():
        return url
    absolute = (Path(base_dir) / path).resolve()
    plain = _plain_sqlite(url)
    if plain is not None:
        # SQLAlchemy's rendering of the same URL (URL.render_as_string: no user, host or
        # query; the database quoted, " +/" safe).
        return f"{plain[0]}:///{quote(str(absolute), safe=' +/')}"
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=str(absolute)).render_as_string(hide_password=False)


def require_existing(url: str, command: str) -> None:
    """A :class:`UsageError` naming the absolute path when ``url`` is a SQLite file that
    does not exist (``command``: who refuses, for the message)."""
    path = sqlite_path(url)
    if path is not None and path.is_dir():
        raise UsageError(f"{command}: {path.resolve()} (from {url}) is a folder, not a "
                         "database file; give the file, e.g. sqlite:///FOLDER/autotune.db")
    if path is not None and not path.is_file():
        raise UsageError(f"{command}: no database at {path.resolve()} (from {url}); give "
                         "the study file, or the --storage URL the study was run with")


def nothing_to_read(url: str) -> bool:
    """Whether a command that only looks (``plan``) has no database at ``url``: SQLite in
    memory, or a file that does not exist (opening it would create one). ``${VAR}`` is
    expanded first; an unset one is not judged here (opening the URL names it).

    Answered without the database layer: ``plan`` on a study that has not run keeps its
    CPU time for the plan (SQLAlchemy's ORM, Alembic and Optuna's storage are ~0.5 s of
    imports, a third of the 2 s a plan of the 175B study may take).

    >>> nothing_to_read("sqlite:///:memory:"), nothing_to_read("postgresql://db/x")
    (True, False)
    """
    if any(name not in os.environ for name in ENV_VAR_RE.findall(url)):
        return False
    url = ENV_VAR_RE.sub(lambda m: os.environ[m.group(1)], url)
    if not url.startswith("sqlite"):
        return False
    path = sqlite_path(url)
    return path is None or not path.is_file()
