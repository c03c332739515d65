"""A trial's process tree dies with its runner, even when the runner dies by SIGKILL.

``python _supervisor.py RUNNER_PID -- COMMAND...`` (standard library only, started as a
file, so it costs no import of autotune) runs COMMAND as its child and watches two things
every 0.2 s: its child, whose exit code it returns, and the runner, whose death (SIGKILL,
node failure of the runner's process alone, OOM killer) makes it kill the whole tree at
once. ``PR_SET_PDEATHSIG`` on torchrun (the launcher's earlier guard) reaches torchrun
only: torchrun then waits out its own grace, and a rank blocked in a collective trains on
for ~30 s; torchrun also starts each rank in a session of its own, so no
process-group kill reaches them. The supervisor is a child subreaper
(``PR_SET_CHILD_SUBREAPER``, Linux >= 3.4): whatever of the tree is orphaned is re-parented
to it, so it still finds every rank after torchrun is gone.

SIGTERM (the runner's timeout or cancel:
:meth:`autotune.launchers.local.LocalLauncher._kill`) is passed to the
whole tree, then, after a grace, SIGKILL; the supervisor exits after its tree.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

_POLL_S = 0.2
_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass  # not Linux: the runner's polling below still kills the tree it can see


def tree_of(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap() -> None:
    """Collect exited orphans (a subreaper inherits them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(child: subprocess.Popen[bytes], grace_s: float) -> None:
    me = os.getpid()
    _signal(tree_of(me), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and tree_of(me):
        _reap()
        time.sleep(0.05)
    for _ in range(3):  # a process forked meanwhile is caught by the next pass
        _signal(tree_of(me), signal.SIGKILL)
        time.sleep(0.05)
        _reap()
    child.poll()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: _supervisor.py RUNNER_PID -- COMMAND...", file=sys.stderr)
        return 2
    runner = int(argv[0])
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1)  # the runner's death, at once where possible
    died: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        died.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    child = subprocess.Popen(argv[2:])
    while True:
        code = child.poll()
        if code is not None:
            kill_tree(child, 0.0)  # what the command left behind dies with it
            if code < 0:  # died of a signal: so does the supervisor (the launcher reads it)
                if -code not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            return code
        if died or os.getppid() != runner:
            kill_tree(child, _GRACE_S if died == [signal.SIGTERM] else 0.0)
            return 128 + signal.SIGTERM
        time.sleep(_POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
