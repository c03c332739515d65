"""Where a study and its measurements live: the ``storage`` section of a study file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autotune.config._fields import check_int, check_keys
from autotune.errors import SpecError

__all__ = ["StorageConfig", "MAX_HEARTBEAT_S", "MAX_GRACE_S"]

MAX_HEARTBEAT_S = 86_400
MAX_GRACE_S = 30 * 86_400


@dataclass(frozen=True)
class StorageConfig:
    """Where the study and its measurements live."""

    url: str = "sqlite:///autotune.db"
    """SQLAlchemy URL: ``sqlite:///file.db``, ``postgresql+psycopg://...``, ``mysql+pymysql://...``.
    A relative SQLite file in a study file lies next to the study file (``--storage`` on
    the command line: the current folder)."""
    heartbeat_interval_s: int = 10
    """How often a running trial renews its claim's lease (proves it is alive)."""
    grace_period_s: int = 60
    """A claim's lease: a running trial silent this long is stale, failed as ``killed``
    and its layout retried."""
    transaction_timeout_s: int = 30
    """The longest a transaction of autotune's may sit idle or wait for a lock
    (docs/hpc.md, "Database outages and frozen workers"). PostgreSQL ends a session idle
    in a transaction this long (``idle_in_transaction_session_timeout``; its locks go with
    it) and cancels a lock wait or a statement after twice this; MariaDB likewise
    (``idle_transaction_timeout``, ``innodb_lock_wait_timeout``, ``max_statement_time``);
    MySQL ends a connection idle this long (``wait_timeout``). SQLite cannot take a lock
    from a stopped process: a writer waits this long for it (the busy timeout), then
    says so and retries."""
    outage_wait_s: int = 300
    """How long a worker waits out a database that is unreachable, in crash recovery,
    full (too many connections), locked, or that closed its connection, retrying with
    one line each time; then it gives up with one line and exit code 1 (a rerun
    resumes). Before the first connection a refused connection fails at once: most often
    a wrong URL."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or "://" not in self.url or len(self.url) > 4096 \
                or not self.url.isprintable():
            shown = re.sub(r"(?s)://.*@", "://***@", self.url) if isinstance(self.url, str) \
                else self.url  # never a password in a message
            raise SpecError("storage.url", shown, "allowed: a SQLAlchemy URL (one line, at "
                            "most 4096 characters) such as sqlite:///autotune.db")
        check_int("storage.heartbeat_interval_s", self.heartbeat_interval_s,
                  maximum=MAX_HEARTBEAT_S)
        check_int("storage.grace_period_s", self.grace_period_s, maximum=MAX_GRACE_S)
        check_int("storage.transaction_timeout_s", self.transaction_timeout_s,
                  maximum=MAX_HEARTBEAT_S)
        check_int("storage.outage_wait_s", self.outage_wait_s, minimum=0, maximum=MAX_GRACE_S)
        if self.grace_period_s <= self.heartbeat_interval_s:
            raise SpecError("storage.grace_period_s", self.grace_period_s,
                            f"allowed: more than heartbeat_interval_s={self.heartbeat_interval_s}")

    @classmethod
    def from_dict(cls, data: Any) -> StorageConfig:
        return cls(**check_keys("storage", data, cls.__dataclass_fields__))
