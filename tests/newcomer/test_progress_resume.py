"""Honest progress: on resume the counter counts the study's trials, a batch is one line,
and the header states the correction the resumed run uses."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from autotune.layout import Layout
from autotune.runner.progress import Progress
from tests.helpers import REPO, run_cli, write_study
from tests.newcomer.fake_trainer import fake_trainer


def test_resume_counts_from_the_study_and_batches_are_one_line() -> None:
    out = io.StringIO()
    progress = Progress(total=7, stream=out)
    progress.resume(5)
    lays = [Layout(tp=1, pp=1, dp=1, micro_batch=m, grad_accum=16 // m) for m in (1, 2)]
    progress.launch_started([(5, lays[0], None), (6, lays[1], 1.5)])
    lines = out.getvalue().splitlines()
    assert lines[0] == "[autotune] resuming: 5 of 7 trials measured, 2 to go"
    assert len(lines) == 2 and lines[1].startswith("[6-7/7] batch of 2: running #5 ")


@pytest.mark.slow
def test_resumed_run_counts_on_and_states_its_correction(tmp_path: Path) -> None:
    python, launched = fake_trainer(tmp_path)
    search = {"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8], "zero_stage": [0],
              "recompute": ["none"], "strategy": "cost-model-only", "n_trials": 2}
    path = write_study(tmp_path / "r.yaml", name="r", devices=1, search=search,
                       trial={"warmup_steps": 1, "measure_steps": 2, "timeout_s": 120,
                              "device": "cpu", "batch_size": 2},
                       launcher={"kind": "local", "run_dir": str(tmp_path / "runs"),
                                 "local": {"python": str(python)}})
    env = {"PYTHONPATH": str(REPO)}
    first = run_cli("run", str(path), env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("batch of 2: running") == 1, first.stderr
    assert "[1-2/2] batch of 2" in first.stderr
    status = run_cli("status", str(path), env=env, timeout=120)
    resumed = run_cli("run", str(path), "--n-trials", "3", env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    err = resumed.stderr
    assert "resuming: 2 of 3 trials measured, 1 to go" in err, err
    assert "[3/3] trial #2 " in err and "[1/3]" not in err, err
    header = next(line for line in err.splitlines() if "calibration:" in line)
    assert "no correction yet" not in header, (header, status.stdout)
    assert len(launched.read_text().splitlines()) == 2
