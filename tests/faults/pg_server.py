"""A PostgreSQL server of the fault suite's own: ``initdb`` into a temporary directory, its
own port, stopped (and removed) at the end. The faults stop and restart it, which must
never happen to the machine's server that other tests and people share (issue 23).

The binaries are found at run time: ``$AUTOTUNE_TEST_PG_BIN`` (a directory), else the
``initdb`` on ``PATH``, else ``pg_config --bindir``, else the newest Debian/Ubuntu cluster
directory (``/usr/lib/postgresql/<major>/bin``, the layout of the ``postgresql`` package).
``initdb`` refuses to run as root: as root, the server runs as the ``postgres`` user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PgServer", "find_bindir"]

DEBIAN_GLOB = "/usr/lib/postgresql/*/bin"


def find_bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl`` (module docstring), ``None`` if none."""
    env = os.environ.get("AUTOTUNE_TEST_PG_BIN")
    candidates = [Path(env)] if env else []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                              check=False)
        if done.returncode == 0 and done.stdout.strip():
            candidates.append(Path(done.stdout.strip()))
    debian = sorted(Path("/").glob(DEBIAN_GLOB.lstrip("/")),
                    key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    candidates.extend(reversed(debian))
    return next((d for d in candidates if (d / "initdb").is_file()
                 and (d / "pg_ctl").is_file()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One server: :meth:`start`, :meth:`stop` (``immediate``: as a crash), :attr:`url`."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="autotune-faults-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.port = _free_port()
        self._user: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")  # KeyError: no such user (the caller skips)
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._user = ["runuser", "-u", "postgres", "--"]
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._user, *args], capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=self.root)

    def init(self) -> str | None:
        """``initdb``; ``None``, or why it failed."""
        done = self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust",
                         "-U", "postgres", "-E", "UTF8", "--no-sync")
        return None if done.returncode == 0 else (done.stderr or done.stdout).strip()[-500:]

    def start(self, *, wait: bool = True) -> str | None:
        """Start it (``-w``: until it accepts connections); ``None``, or why not."""
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=60")
        done = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                         str(self.log), "-o", options, "-w" if wait else "-W", "start")
        return None if done.returncode == 0 else (done.stderr or done.stdout).strip()[-500:]

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``: ``immediate`` ends every backend at once, without a
        checkpoint, and the next start runs crash recovery (issue 23 A)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                  "stop")

    def restart_immediately(self) -> float:
        """An immediate stop, then a start at once; the seconds it was not accepting."""
        t0 = time.monotonic()
        self.stop("immediate")
        why = self.start()
        if why:
            raise RuntimeError(f"own PostgreSQL did not start again: {why}")
        return time.monotonic() - t0

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
