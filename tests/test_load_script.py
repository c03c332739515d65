"""``scripts/test_under_load.sh``: pytest beside busy loops, its exit code passed on, the
loops gone when it ends, and a bad ``LOAD_PROCS`` refused before anything starts."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, is_live

SCRIPT = REPO / "scripts" / "test_under_load.sh"
pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(),
                                reason="the script runs the checkout's .venv")


def _run(tmp_path: Path, body: str, procs: str = "1") -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_probe.py"
    test.write_text(f"def test_probe():\n    {body}\n")
    env = {**os.environ, "LOAD_PROCS": procs}
    return subprocess.run(["bash", str(SCRIPT), "-p", "no:cacheprovider", str(test)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("body", "code"), [("assert True", 0), ("assert False", 1)])
def test_pytest_runs_beside_the_loops_and_its_code_is_the_scripts(
        tmp_path: Path, body: str, code: int) -> None:
    done = _run(tmp_path, body, procs="2")
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    started = re.search(r"\[load\] 2 busy loop\(s\) \(pids ([\d ]+)\)", done.stdout)
    assert started, done.stdout[-2000:]
    pids = [int(p) for p in started.group(1).split()]
    assert len(pids) == 2
    assert f"[load] pytest exited {code} after" in done.stdout
    assert not [p for p in pids if is_live(p)], "busy loops left running"


@pytest.mark.parametrize("procs", ["0", "00", "abc", "-1", "2.5"])
def test_a_bad_load_procs_is_refused_naming_it(tmp_path: Path, procs: str) -> None:
    done = _run(tmp_path, "assert True", procs=procs)
    assert done.returncode == 2
    assert f"LOAD_PROCS={procs}: allowed: an integer >= 1" in done.stderr
    assert "busy loop" not in done.stdout
