"""Fixtures of the fault-injection suite (marker ``faults``): its own PostgreSQL server
(:mod:`tests.faults.pg_server`) and a small tmpfs. As every service fixture
(``tests/conftest.py``): under ``CI=true`` a missing one fails, never skips."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.faults.pg_server import PgServer, find_bindir


@pytest.fixture(scope="session")
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of this suite's own, for the session; removed at the end."""
    bindir = find_bindir()
    if bindir is None:
        unavailable("own PostgreSQL server", "no initdb/pg_ctl found (set "
                    "AUTOTUNE_TEST_PG_BIN to their directory)")
    try:
        server = PgServer(bindir)
    except KeyError:
        unavailable("own PostgreSQL server", "running as root and there is no 'postgres' "
                    "user to run initdb as")
    try:
        why = server.init() or server.start()
        if why:
            unavailable("own PostgreSQL server", why)
        yield server
    finally:
        server.remove()


@pytest.fixture
def small_tmpfs() -> Iterator[Path]:
    """A 4 MiB tmpfs (a disk that fills up at once), unmounted afterwards."""
    where = Path(tempfile.mkdtemp(prefix="autotune-faults-tmpfs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        os.rmdir(where)
        unavailable("a small tmpfs", f"mount failed (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        os.rmdir(where)
