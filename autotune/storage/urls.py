"""Database URLs: validation, credentials from the environment, and masking.

A password never appears in output or logs: everything user-facing goes through
:func:`mask_url`. Credentials can stay out of study files: ``AUTOTUNE_DB_PASSWORD`` or
``AUTOTUNE_DB_PASSWORD_FILE`` fill in a URL that has a user but no password, and
``${VAR}`` in a URL is expanded from the environment.

>>> mask_url("postgresql+psycopg://tuner:s3cret@db:5432/tuning")
'postgresql+psycopg://tuner:***@db:5432/tuning'
>>> backend_of("sqlite:///autotune.db")
'sqlite'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from autotune.errors import SpecError

__all__ = ["mask_url", "resolve_url", "backend_of", "SUPPORTED"]

SUPPORTED = {
    "sqlite": ("sqlite",),
    "postgresql": ("postgresql", "postgresql+psycopg", "postgresql+psycopg2"),
    "mysql": ("mysql", "mysql+pymysql", "mariadb+pymysql"),
}
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def mask_url(url: str | URL) -> str:
    """The URL with its password replaced by ``***`` (safe to print)."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", str(url))
    return parsed.render_as_string(hide_password=True)


def backend_of(url: str) -> str:
    """``sqlite``, ``postgresql`` or ``mysql``; a clear error for anything else."""
    try:
        driver = make_url(url).drivername
    except ArgumentError:
        raise SpecError("storage.url", mask_url(url),
                        "not a database URL; e.g. sqlite:///autotune.db or "
                        "postgresql+psycopg://user@host:5432/db") from None
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

    url = _ENV_RE.sub(_expand, url)
    backend = backend_of(url)
    if backend == "sqlite":
        return url
    parsed = make_url(url)
    if parsed.username and parsed.password is None:
        password = os.environ.get("AUTOTUNE_DB_PASSWORD")
        pw_file = os.environ.get("AUTOTUNE_DB_PASSWORD_FILE")
        if password is None and pw_file:
            try:
                password = Path(pw_file).read_text().strip()
            except OSError as err:
                raise SpecError("AUTOTUNE_DB_PASSWORD_FILE", pw_file,
                                f"cannot be read ({err.strerror})") from None
        if password is not None:
            parsed = parsed.set(password=password)
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")  # psycopg 3, not psycopg2
    if backend == "mysql" and parsed.drivername == "mysql":
        parsed = parsed.set(drivername="mysql+pymysql")
    return parsed.render_as_string(hide_password=False)
