"""A resume after Ctrl-C measures the interrupted batch's members together, in one launch
(each alone took 5 launches where the batch had taken one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli, write_study
from tests.newcomer.fake_trainer import fake_trainer

pytestmark = pytest.mark.slow


def test_interrupted_batch_is_resumed_as_one_launch(tmp_path: Path) -> None:
    python, launched = fake_trainer(tmp_path)
    (tmp_path / "hold").touch()
    search = {"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8], "zero_stage": [0],
              "recompute": ["none"], "strategy": "cost-model-only", "n_trials": 4}
    path = write_study(tmp_path / "b.yaml", name="b", devices=1, search=search,
                       trial={"warmup_steps": 1, "measure_steps": 2, "timeout_s": 300,
                              "device": "cpu", "batch_size": 4},
                       launcher={"kind": "local", "run_dir": str(tmp_path / "runs"),
                                 "local": {"python": str(python)}})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runner = subprocess.Popen([sys.executable, "-m", "autotune", "run", str(path)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not launched.exists():
            assert runner.poll() is None and time.monotonic() < deadline, "no launch"
            time.sleep(0.05)
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=120) == 130
    finally:
        if runner.poll() is None:
            runner.kill()
    (tmp_path / "hold").unlink()
    assert [sorted(json.loads(x)) for x in launched.read_text().splitlines()] == [[1, 2, 4, 8]]

    done = run_cli("run", str(path), env={"PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr
    launches = [sorted(json.loads(x)) for x in launched.read_text().splitlines()]
    assert launches == [[1, 2, 4, 8], [1, 2, 4, 8]], (launches, done.stderr[-3000:])  # one launch
    assert "batch of 4: running" in done.stderr
