"""Local launcher: ``torchrun --standalone`` on this machine, one process per device.

The embedded default. Every trial runs in its own process session (``start_new_session``)
so that a timeout or Ctrl-C kills the whole tree — torchrun *and* its ranks — with one
``killpg``; ``--standalone`` lets torchrun pick a free rendezvous port, so several
workers can share a machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Any

from autotune.config.launcher import LocalOptions
from autotune.errors import LaunchError
from autotune.launchers.base import Launcher, TrialPaths
from autotune.trial import TrialSpec

__all__ = ["LocalLauncher", "trainer_env"]

_KILL_GRACE_S = 5.0


def trainer_env(spec: TrialSpec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for trial ranks: one BLAS thread per rank (ranks share the cores), and
    DeepSpeed told it is on the CPU when the spec says so (its probe would guess)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if spec.run.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    env.update(extra or {})
    return env


class LocalLauncher(Launcher):
    """Runs each trial under ``torchrun`` on this host."""

    kind = "local"

    def __init__(self, options: LocalOptions | None = None) -> None:
        super().__init__()
        self.options = options or LocalOptions()

    def command(self, spec: TrialSpec, paths: TrialPaths) -> list[str]:
        python = self.options.python or sys.executable
        return [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={spec.layout.world_size}",
                "-m", "trainer", "--spec", str(paths.spec), "--result", str(paths.result)]

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        try:
            with open(paths.stdout, "wb") as out, open(paths.stderr, "wb") as err:
                return subprocess.Popen(
                    self.command(spec, paths), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                    env=trainer_env(spec, self.options.env), start_new_session=True,
                )
        except OSError as err:
            raise LaunchError(f"could not start torchrun: {err}") from err

    def _poll(self, handle: subprocess.Popen[bytes]) -> int | None:
        return handle.poll()

    def _kill(self, handle: subprocess.Popen[bytes]) -> None:
        # SIGTERM first so torchrun can tear its ranks down, then SIGKILL the whole group.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(handle.pid, sig)
            except ProcessLookupError:
                pass
            try:
                handle.wait(timeout=_KILL_GRACE_S)
                if sig == signal.SIGTERM:
                    # torchrun exited; ranks it could not reap die with the group.
                    try:
                        os.killpg(handle.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            except subprocess.TimeoutExpired:
                continue

    def _finish(self, handle: subprocess.Popen[bytes]) -> tuple[str | None, list[str]]:
        return None, [socket.gethostname()]
