"""Output that survives its reader: ``| head`` is quiet, and a pipe closed mid-run (``| tee``
killed by the same Ctrl-C) still leaves the running trial recorded as ``interrupted``.

The trainer is a stand-in (``launcher.local.python``, as in test_batch_kill_recovery): it
notes its launch and then sleeps until the runner's interrupt kills it.
"""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.util.streams import Forgiving
from tests.helpers import REPO, run_cli, write_study

_SLEEPING_TRAINER = """#!{python}
import sys, time
open({launched!r}, "a").write("launched\\n")
time.sleep(300)
"""


def test_a_forgiving_stream_mutes_itself_after_the_first_error() -> None:
    class Closing(io.StringIO):
        def write(self, s: str) -> int:
            if "second" in s:
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(s)

    inner = Closing()
    out = Forgiving(inner)  # type: ignore[arg-type]
    out.write("first\n")
    out.write("second\n")
    out.write("third\n")
    out.flush()
    assert out.closed_by_reader and inner.getvalue() == "first\n"


def test_plan_into_head_is_quiet() -> None:
    proc = subprocess.run(
        f"{sys.executable} -m autotune plan studies/lrz_gpt175b.yaml --no-learn --format csv"
        " --top 1000 | head -1; exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash",
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("rank,layout,") and proc.stdout.count("\n") == 1
    assert proc.stderr == ""


@pytest.mark.slow
def test_pipe_closed_mid_run_then_sigint_records_interrupted(tmp_path: Path) -> None:
    launched = tmp_path / "launched"
    fake = tmp_path / "fake-python"
    fake.write_text(_SLEEPING_TRAINER.format(python=sys.executable, launched=str(launched)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    search = {"tp": [1], "pp": [1], "micro_batch": [1, 2], "zero_stage": [0],
              "recompute": ["none"], "strategy": "cost-model-only", "n_trials": 2}
    path = write_study(tmp_path / "p.yaml", name="p", devices=1, search=search,
                       launcher={"kind": "local", "run_dir": str(tmp_path / "runs"),
                                 "local": {"python": str(fake)}})
    runner = subprocess.Popen([sys.executable, "-m", "autotune", "run", str(path)],
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not launched.exists():
            assert runner.poll() is None and time.monotonic() < deadline, "no launch"
            time.sleep(0.05)
        assert runner.stdout is not None
        runner.stdout.close()  # the reader (tee) is gone before the interrupt's lines
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=120) == 130
    finally:
        if runner.poll() is None:
            runner.kill()
    trials = optuna.load_study(study_name="p", storage=f"sqlite:///{tmp_path / 'study.db'}"
                               ).get_trials()
    outcomes = [t.user_attrs.get("outcome") for t in trials]
    assert outcomes and set(outcomes) == {"interrupted"}, outcomes
    status = run_cli("status", str(path), env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert "node failure" not in status.stdout and "killed" not in status.stdout, status.stdout
