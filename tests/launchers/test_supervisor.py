"""The trial's tree dies with its runner at once, ranks in sessions of their own included
(issue #17: one rank blocked in a collective trained on ~30 s after a SIGKILLed runner)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.launchers.local import SUPERVISOR
from tests.helpers import processes_mentioning

# A "torchrun" that starts two "ranks", each in a session of its own (as torchrun does),
# ignoring SIGTERM (as a rank blocked in a collective effectively does).
_TREE = ("import subprocess, sys, time, signal\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "for i in range(2):\n"
         "    subprocess.Popen([sys.executable, '-c', 'import signal, time; "
         "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)', sys.argv[1]],"
         " start_new_session=True)\n"
         "time.sleep(300)\n")


def _gone(marker: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not processes_mentioning(marker):
            return True
        time.sleep(0.1)
    return False


def test_the_tree_dies_within_a_second_of_the_runner_s_sigkill(tmp_path: Path) -> None:
    marker = f"rank-marker-{os.getpid()}-{tmp_path.name}"
    # The "runner": starts the supervised tree, then sleeps until it is SIGKILLed.
    runner_code = ("import os, subprocess, sys, time\n"
                   f"subprocess.Popen([sys.executable, {SUPERVISOR!r}, str(os.getpid()), '--',"
                   f" sys.executable, '-c', {_TREE!r}, {marker!r}], start_new_session=True)\n"
                   "time.sleep(300)\n")
    runner = subprocess.Popen([sys.executable, "-c", runner_code])
    deadline = time.monotonic() + 20
    while len(processes_mentioning(marker)) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)  # supervisor, "torchrun" and two "ranks"
    assert len(processes_mentioning(marker)) >= 3, processes_mentioning(marker)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    t0 = time.monotonic()
    assert _gone(marker, 3.0), processes_mentioning(marker)
    assert time.monotonic() - t0 < 1.5


def test_the_supervisor_returns_its_command_s_exit_code(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, SUPERVISOR, str(os.getpid()), "--", sys.executable,
                         "-c", "import sys; sys.exit(3)"], timeout=30)
    assert ok.returncode == 3
    killed = subprocess.run([sys.executable, SUPERVISOR, str(os.getpid()), "--", sys.executable,
                             "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                            timeout=30)
    assert killed.returncode == -signal.SIGKILL  # a signal is passed on as a signal
