"""Database URLs: validation, credentials from the environment, and masking.

A password never appears in output or logs: everything user-facing goes through
:func:`mask_url`. Credentials can stay out of study files: ``AUTOTUNE_DB_PASSWORD`` or
``AUTOTUNE_DB_PASSWORD_FILE`` fill in a URL that has a user but no password, and
``${VAR}`` in a URL is expanded from the environment.

>>> mask_url("postgresql+psycopg://tuner:s3cret@db:5432/tuning")
'postgresql+psycopg://tuner:***@db:5432/tuning'
>>> mask_url("postgresql+psycopg://tuner:se@cret@db:5432/tuning")  # an unencoded '@'
'postgresql+psycopg://tuner:***@db:5432/tuning'
>>> backend_of("sqlite:///autotune.db")
'sqlite'
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from autotune.config.sqlite_file import ENV_VAR_RE
from autotune.errors import SpecError

__all__ = ["mask_url", "mask_env", "SECRET_NAME", "resolve_url", "backend_of", "parse_url",
           "SUPPORTED"]

SUPPORTED = {
    "sqlite": ("sqlite",),
    "postgresql": ("postgresql", "postgresql+psycopg", "postgresql+psycopg2"),
    "mysql": ("mysql", "mysql+pymysql", "mariadb+pymysql"),
}


def _mask_raw(url: str) -> str:
    """Everything between ``://`` and the last ``@`` hidden but a plain user name: for a
    URL SQLAlchemy cannot parse, or parses with part of the password in the host (an
    unencoded ``@`` in it). Hides too much rather than any of the password."""
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest or head.startswith("sqlite"):  # no credentials
        return url
    creds, _, host = rest.rpartition("@")
    user, colon, _ = creds.partition(":")
    if not colon and "@" not in creds:
        return url  # a user, no password
    shown = f"{user}:" if colon and "@" not in user else ""
    return f"{head}://{shown}***@{host}"


def mask_url(url: str | URL) -> str:
    """The URL with its password replaced by ``***`` (safe to print, whatever the URL)."""
    if not isinstance(url, str):
        url = url.render_as_string(hide_password=False)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return _mask_raw(url)
    if "@" in (parsed.host or "") or "@" in (parsed.username or ""):
        return _mask_raw(url)
    return parsed.render_as_string(hide_password=True)


_AT_HINT = ("an unencoded '@' in the user name or password; allowed: '@' written as %40 "
            "(urllib.parse.quote), or no password in the URL and AUTOTUNE_DB_PASSWORD or "
            "AUTOTUNE_DB_PASSWORD_FILE set")


def _netloc(url: str) -> str:
    """What lies between ``://`` and the path: ``user:password@host:port``."""
    return url.partition("://")[2].split("/", 1)[0]


SECRET_NAME = re.compile(r"(?i)token|secret|passw|credential|api_?key|private|auth")
"""Environment variable names whose values are never written down."""
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")
MASK = "***"


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with secret values masked.

    >>> mask_env({"HF_TOKEN": "abc", "DB": "postgresql://me:pw@host/db", "LOCAL_SIZE": "2"})
    {'HF_TOKEN': '***', 'DB': 'postgresql://me:***@host/db', 'LOCAL_SIZE': '2'}
    """
    return {k: MASK if SECRET_NAME.search(k) else _URL_PASSWORD.sub(rf"\g<1>{MASK}@", v)
            for k, v in env.items()}


def parse_url(url: str, field: str = "storage.url") -> URL:
    """``url`` parsed, or a :class:`SpecError` (exit 2) that shows it masked: a URL that is
    not one, a port that is not a number in 1-65535, an unencoded ``@`` in the password
    (SQLAlchemy would take the rest of the password for the host, and print it)."""
    example = "e.g. sqlite:///autotune.db or postgresql+psycopg://user@host:5432/db"
    if not isinstance(url, str):
        raise SpecError(field, type(url).__name__, f"allowed: a database URL string; {example}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SpecError(field, mask_url(url), f"not a database URL; {example}") from None
    except ValueError:
        if _netloc(url).count("@") > 1:
            raise SpecError(field, mask_url(url), _AT_HINT) from None
        raise SpecError(field, mask_url(url), "a port that is not a number; allowed: "
                        "host:PORT with PORT 1-65535, e.g. db.example.org:5432") from None
    if "@" in (parsed.host or "") or "@" in (parsed.username or ""):
        raise SpecError(field, mask_url(url), _AT_HINT)
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise SpecError(field, mask_url(url), f"port {parsed.port}; allowed: a port 1-65535")
    return parsed


def backend_of(url: str) -> str:
    """``sqlite``, ``postgresql`` or ``mysql``; a clear error for anything else."""
    driver = parse_url(url).drivername
    for backend, drivers in SUPPORTED.items():
        if driver in drivers:
            return backend
    allowed = ", ".join(d for ds in SUPPORTED.values() for d in ds)
    raise SpecError("storage.url", mask_url(url),
                    f"unsupported driver {driver!r}; allowed: {allowed}")


def resolve_url(url: str) -> str:
    """Expand ``${VAR}`` and fill a missing password from the environment."""
    def _expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise SpecError("storage.url", mask_url(url), f"environment variable {name} is not set")
        return os.environ[name]

    url = ENV_VAR_RE.sub(_expand, url)
    backend = backend_of(url)
    if backend == "sqlite":
        database = parse_url(url).database
        if database in (None, "", ":memory:"):
            # SQLAlchemy opens an in-memory database for these: a study stored there is
            # gone when the command ends (and before: "no such table: version_info").
            raise SpecError("storage.url", url, "a SQLite URL without a file; "
                            "allowed: sqlite:///FILE (relative) or sqlite:////ABS/PATH, "
                            "e.g. sqlite:///autotune.db")
        if Path(database or "").expanduser().is_dir():
            raise SpecError("storage.url", url, "names a folder; allowed: a SQLite file in "
                            "it, e.g. sqlite:///FOLDER/autotune.db")
        return url
    parsed = parse_url(url)
    if parsed.username and parsed.password is None:
        password = os.environ.get("AUTOTUNE_DB_PASSWORD")
        pw_file = os.environ.get("AUTOTUNE_DB_PASSWORD_FILE")
        if password is None and pw_file:
            try:
                password = Path(pw_file).read_text().strip()
            except OSError as err:
                raise SpecError("AUTOTUNE_DB_PASSWORD_FILE", pw_file,
                                f"cannot be read ({err.strerror})") from None
            except UnicodeDecodeError:  # a binary file named by mistake: not a traceback
                raise SpecError("AUTOTUNE_DB_PASSWORD_FILE", pw_file,
                                "not UTF-8 text; allowed: a file holding the password") from None
        if password is not None:
            parsed = parsed.set(password=password)
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")  # psycopg 3, not psycopg2
    if backend == "mysql" and parsed.drivername == "mysql":
        parsed = parsed.set(drivername="mysql+pymysql")
    return parsed.render_as_string(hide_password=False)
