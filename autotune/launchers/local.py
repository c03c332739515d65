"""Local launcher: ``torchrun --standalone`` on this machine, one process per device.

The embedded default. Every trial runs under a supervisor
(:mod:`autotune.launchers._supervisor`) in its own process session: a timeout or Ctrl-C
kills the whole tree — torchrun *and* its ranks — and so does the runner's death, even by
SIGKILL (the supervisor watches the runner); ``--standalone`` lets torchrun pick a free
rendezvous port, so several workers can share a machine.

torchrun starts the workload's program (:meth:`Workload.argv <autotune.workloads.base.
Workload.argv>`) with ``--no-python``, so the program may be any command: ``python -m
trainer ...`` for the built-in trainer, the user's own for a foreign workload. A workload
with ``outer: none`` is started as it is, without torchrun (it is its own launcher).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autotune.config.launcher import LocalOptions
from autotune.errors import LaunchError
from autotune.launchers._supervisor import tree_of
from autotune.launchers.base import Launcher
from autotune.launchers.launch_record import write_launch_record
from autotune.trial import TrialPaths, TrialSpec
from autotune.workloads.base import Placement
from trainer.timeline import LAUNCH_TIME_ENV

__all__ = ["LocalLauncher", "trainer_env"]

_KILL_GRACE_S = 5.0


def trainer_env(spec: TrialSpec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for trial ranks: one BLAS thread per rank (ranks share the cores), and
    DeepSpeed told it is on the CPU when the spec says so (its probe would guess)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # The trainer books the time from here to its first line as its "process_start"
    # (trainer/timeline.py): torchrun's or srun's start and the interpreter's.
    env[LAUNCH_TIME_ENV] = repr(time.time())
    env["PYTHONUNBUFFERED"] = "1"
    if spec.run.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    env.update(extra or {})
    return env


SUPERVISOR = str(Path(__file__).with_name("_supervisor.py"))
"""The trial's parent process (:mod:`autotune.launchers._supervisor`): it kills the whole
tree when the runner dies, at once (a file: it imports nothing of autotune)."""


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the runner dies (even by SIGKILL), so that the
    supervisor kills the tree at once, not only at its next poll (Linux
    ``PR_SET_PDEATHSIG``)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the next run's stale-trial handling still retries the layout


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere): the
    supervisor's walk, which stays in its standard-library-only module."""
    return tree_of(pid)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class LocalLauncher(Launcher):
    """Runs each trial under ``torchrun`` on this host."""

    kind = "local"
    supports_batches = True
    supports_hold = True

    def __init__(self, options: LocalOptions | None = None) -> None:
        super().__init__()
        self.options = options or LocalOptions()

    def placement(self, spec: TrialSpec) -> Placement:
        """One node, every rank here; a free port for a workload that rendezvouses itself
        (``outer: none``; torchrun ``--standalone`` picks its own)."""
        return Placement(python=self.options.python or sys.executable, nodes=1,
                         ranks_per_node=spec.layout.world_size, master_addr="127.0.0.1",
                         master_port=_free_port())

    def command(self, spec: TrialSpec, paths: TrialPaths) -> list[str]:
        placement = self.placement(spec)
        program = self.workload.argv(spec, paths, placement)
        if not self.workload.per_device:
            return program
        return [placement.python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={spec.layout.world_size}", "--no-python", *program]

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        env = trainer_env(spec, {**self.options.env, **self.workload.env(spec, paths)})
        # Under the supervisor: the tree dies with this runner, even by SIGKILL.
        argv = [sys.executable, SUPERVISOR, str(os.getpid()), "--", *self.command(spec, paths)]
        write_launch_record(paths, argv=argv, env=env)
        try:
            with open(paths.stdout, "wb") as out, open(paths.stderr, "wb") as err:
                return subprocess.Popen(
                    argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                    env=env, start_new_session=True, preexec_fn=_die_with_parent,
                )
        except OSError as err:
            raise LaunchError(f"could not start {self.workload.kind} trial: {err}") from err

    def _poll(self, handle: subprocess.Popen[bytes]) -> int | None:
        return handle.poll()

    def _kill(self, handle: subprocess.Popen[bytes]) -> None:
        # torchrun starts every rank in a session of its own, so killing torchrun's process
        # group misses the ranks: collect the whole tree first, then SIGTERM it (torchrun
        # and the ranks may clean up), then SIGKILL whatever is left.
        tree = [handle.pid, *descendants(handle.pid)]
        _signal_all(tree, signal.SIGTERM)
        try:
            handle.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        tree += [p for p in descendants(handle.pid) if p not in tree]
        _signal_all(tree, signal.SIGKILL)
        try:
            os.killpg(handle.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        handle.wait()

    def _finish(self, handle: subprocess.Popen[bytes]) -> tuple[str | None, list[str]]:
        return None, [socket.gethostname()]
