"""A claim's and a confirmation's lease: the one :class:`Lease` object that renews it and
knows when it is lost, the clock leases are written in, and whether a runner on this host
is dead for sure (its lease then need not run out).

Shared by :mod:`autotune.storage.claims` (a layout's claim, keyed by its trial) and
:mod:`autotune.storage.confirmations` (a confirmation round), which both keep a lease per
runner in autotune's tables; :func:`utcnow` is also the clock of every time autotune writes
into Optuna's tables and its own.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

if TYPE_CHECKING:
    from autotune.storage.db import Storage

__all__ = ["utcnow", "dead_here", "is_zombie", "Lease"]

_log = logging.getLogger(__name__)


class Lease:
    """A runner's lease on one row of a table with a ``lease_until`` column (a layout's
    claim, a confirmation round), renewed by the runner's heartbeat.

    Lost when a renewal is refused: the row has no lease any more, because a repair gave
    the work to someone else after the runner was silent for ``storage.grace_period_s``.
    A renewal that fails (the database away) is retried at the next beat, its first
    exception logged, and does not lose the lease by itself: while the database is away
    nobody can repair the trial either, and once it is back the next renewal either moves
    the lease on (nobody took it) or is refused (someone did), within one heartbeat.
    Giving up on failures alone would throw away launches that nobody else took.

    ``holder``: the row's worker column and this runner's name, for a row that is taken
    over in place (a confirmation round keeps its id when the next worker claims it, where
    a layout's retry is a new trial): a renewal is refused once another runner holds it.
    """

    def __init__(self, storage: Storage, table: Any, key_column: Any, key: int,
                 what: str, *, holder: tuple[Any, str] | None = None) -> None:
        self.storage, self.table, self.key_column, self.key = storage, table, key_column, key
        self.what = what
        """Whose lease, for people (``trial 12``, ``the confirmation round``)."""
        self.holder = holder
        self.lost: str | None = None
        """Why the lease is lost (one line), ``None`` while it is held."""
        self.first_error: BaseException | None = None
        self.failures = 0
        """Renewals that failed since the last one that passed."""
        self.clock: Callable[[], float] = time.monotonic
        """The monotonic clock the silence is measured on."""
        self._renewed_at = self.clock()

    def renew(self) -> bool:
        """Move the lease on by the grace period; ``False`` if the row has none any more
        (recorded, released, or repaired) or, with a ``holder``, another runner holds it."""
        until = utcnow() + timedelta(seconds=self.storage.config.grace_period_s)
        mine = [] if self.holder is None else [self.holder[0] == self.holder[1]]
        with self.storage.session() as s:
            done = s.execute(update(self.table).where(
                self.key_column == self.key, self.table.lease_until.is_not(None), *mine)
                .values(lease_until=until))
        return getattr(done, "rowcount", 0) == 1

    def beat(self) -> bool:
        """One heartbeat: renew; ``False`` once the lease is lost (:attr:`lost` says why)."""
        if self.lost is not None:
            return False
        try:
            if self.renew():
                self._renewed_at, self.failures = self.clock(), 0
                return True
        except Exception as err:  # the database is away: retried at the next beat
            self.failures += 1
            if self.first_error is None:
                self.first_error = err
                _log.warning("%s: renewing its lease failed (retried each heartbeat): %s",
                             self.what, err)
            return True
        silent_s = self.clock() - self._renewed_at
        self.lost = (f"{self.what}: its lease was taken over after {silent_s:.0f} s without "
                     "a renewal (silent longer than storage.grace_period_s, it was repaired "
                     "or claimed again); it is left to the worker that holds it now")
        return False


def utcnow() -> datetime:
    """Now in UTC, without a zone: how Optuna's tables and autotune's store times (a
    ``TIMESTAMP`` without time zone on every backend)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def dead_here(worker: str | None) -> bool:
    """Whether the claim's runner (``host:pid[/i]``) ran on this host in a process that
    exists no more: dead for sure, its lease need not run out. (Hosts of one name in
    separate PID namespaces, e.g. containers, would mistake each other: give them
    distinct host names.)"""
    if not worker or ":" not in worker:
        return False
    host, _, rest = worker.rpartition(":")
    pid_text = rest.split("/", 1)[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return is_zombie(pid)


def is_zombie(pid: int) -> bool:
    """A killed runner whose parent has not reaped it yet still has a pid (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
