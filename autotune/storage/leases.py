"""A claim's and a confirmation's runner: the clock their leases are written in, and
whether a runner on this host is dead for sure (its lease then need not run out).

Shared by :mod:`autotune.storage.claims` and :mod:`autotune.storage.confirmations`, which
both keep a lease per runner in autotune's tables; :func:`utcnow` is also the clock of every
time autotune writes into Optuna's tables and its own.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone

__all__ = ["utcnow", "dead_here", "is_zombie"]


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
