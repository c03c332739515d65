"""The runner under failure: OOM, hang, SIGKILL of the runner, real trainer processes.

OOM and hang are injected through the trainer's ``run.test_hook`` by a launcher subclass
that sets the hook for chosen layouts: a real out-of-memory needs accelerator memory this
CPU machine does not have, and the trainer's own OOM classification under a real memory
limit is tested in ``tests/trainer``. Everything else — the runner, torchrun, the trainer,
the database — is the real thing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from autotune.launchers.local import LocalLauncher
from autotune.layout import Layout
from autotune.runner.study import run_study
from autotune.spec import load_study
from autotune.storage import open_storage
from autotune.trial import LaunchReport, TrialPaths, TrialSpec
from tests.helpers import processes_mentioning, write_study

pytestmark = pytest.mark.slow

_ONE_DEVICE_SPACE = {"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8], "zero_stage": [0],
                     "recompute": ["none"], "strategy": "cost-model-only"}


class InjectingLauncher(LocalLauncher):
    """The local launcher, with a trainer test hook set for the layouts ``hook_for`` names."""

    def __init__(self, hook_for: Callable[[Layout], str]) -> None:
        super().__init__()
        self.hook_for = hook_for
        self.launched: list[Layout] = []

    def run(self, spec: TrialSpec, paths: TrialPaths, *, timeout_s: float) -> LaunchReport:
        self.launched.append(spec.layout)
        spec = replace(spec, run=replace(spec.run, test_hook=self.hook_for(spec.layout)))
        return super().run(spec, paths, timeout_s=timeout_s)

    def run_batch(self, specs: Sequence[TrialSpec], paths: Sequence[TrialPaths], *,
                  timeout_s: float, hold: bool = False) -> list[LaunchReport]:
        # A batch's launch starts the trainer on every spec at once (a batch of one, and
        # the re-runs of a batch's unfinished trials, come through run above).
        if len(specs) > 1:
            self.launched += [s.layout for s in specs]
        specs = [replace(s, run=replace(s.run, test_hook=self.hook_for(s.layout)))
                 for s in specs]
        return super().run_batch(specs, paths, timeout_s=timeout_s, hold=hold)


def _study(tmp_path: Path, name: str, n_trials: int, search: dict, **trial: object):
    path = write_study(tmp_path / f"{name}.yaml", name=name, devices=1, n_trials=n_trials,
                       search={**search, "n_trials": n_trials},
                       trial={"warmup_steps": 1, "measure_steps": 2, "timeout_s": 120,
                              "device": "cpu", **trial})
    spec = load_study(path)
    return spec, open_storage(spec.storage)


def test_oom_is_infeasible_and_bigger_micro_batches_are_not_launched(tmp_path: Path) -> None:
    # First the micro-batch-2 layout runs out of memory ...
    spec, storage = _study(tmp_path, "oom", 1, {**_ONE_DEVICE_SPACE, "micro_batch": [2]})
    oom_all = InjectingLauncher(lambda lay: "oom" if lay.micro_batch >= 2 else "none")
    run_study(spec, storage, oom_all)
    # ... then the full space is searched: 4 and 8 need no less memory, so never launch.
    spec, storage = _study(tmp_path, "oom", 4, _ONE_DEVICE_SPACE)
    launcher = InjectingLauncher(lambda lay: "oom" if lay.micro_batch >= 2 else "none")
    summary = run_study(spec, storage, launcher)
    assert [lay.micro_batch for lay in launcher.launched] == [1]
    assert summary.stopped_by == "exhausted"
    trials = optuna.load_study(study_name="oom", storage=storage.optuna).get_trials()
    oom = [t for t in trials if t.user_attrs.get("outcome") == "oom"]
    assert len(oom) == 1 and oom[0].state == TrialState.PRUNED
    assert oom[0].system_attrs.get("constraints:feasible") == 1.0  # told as infeasible
    assert "out of memory" in oom[0].user_attrs["reason"]
    engine = create_engine(storage.url)
    with engine.connect() as conn:
        launched = conn.execute(text("select micro_batch, outcome from measurements "
                                     "where study_name = 'oom' order by id")).all()
    assert launched == [(2, "oom"), (1, "complete")]


def test_hanging_trial_is_killed_at_its_timeout_and_the_study_goes_on(tmp_path: Path) -> None:
    # Both in one launch (batch_size 4 by default). The hung layout was once recorded
    # ``error``: the trainer's SIGTERM handler wrote it an error result when the launcher's
    # timeout killed the batch; run_batch now knows that result for the timeout's.
    spec, storage = _study(tmp_path, "hang", 2, {**_ONE_DEVICE_SPACE, "micro_batch": [1, 8]},
                           timeout_s=25)
    launcher = InjectingLauncher(lambda lay: "hang" if lay.micro_batch == 8 else "none")
    started = time.monotonic()
    run_study(spec, storage, launcher)
    assert time.monotonic() - started < 120
    trials = optuna.load_study(study_name="hang", storage=storage.optuna).get_trials()
    by_mb = {t.user_attrs["layout_dict"]["micro_batch"]: t for t in trials}
    assert by_mb[8].state == TrialState.FAIL and by_mb[8].user_attrs["outcome"] == "timeout"
    assert by_mb[1].state == TrialState.COMPLETE
    assert processes_mentioning(str(tmp_path / "runs")) == []


def test_sigkilled_runner_leaves_a_trial_that_the_next_run_retries(tmp_path: Path) -> None:
    db = tmp_path / "kill.db"
    path = write_study(tmp_path / "kill.yaml", name="kill", devices=1, db=db, n_trials=2,
                       search={**_ONE_DEVICE_SPACE, "n_trials": 2})
    runner = subprocess.Popen([sys.executable, "-m", "autotune", "run", str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    storage = f"sqlite:///{db}"
    deadline = time.monotonic() + 120
    killed_layout, killed = None, []
    while time.monotonic() < deadline and killed_layout is None:
        time.sleep(0.5)
        try:
            running = optuna.load_study(study_name="kill", storage=storage).get_trials(
                states=(TrialState.RUNNING,))
        except (KeyError, SQLAlchemyError):
            continue  # not created yet, or this poll raced the runner creating the tables
        if running and processes_mentioning("-m trainer"):
            time.sleep(2)  # inside the trial
            os.kill(runner.pid, signal.SIGKILL)
            killed_layout = running[0].params
            killed = sorted(str(t.params) for t in running)  # a batch: all of its trials
    runner.wait(timeout=30)
    assert killed_layout is not None, "the runner never started a trial"
    # The trial dies with the runner (its supervisor kills torchrun and every rank at
    # once); no orphan trains on.
    for _ in range(30):
        if not processes_mentioning(str(tmp_path / "runs")):
            break
        time.sleep(0.1)
    assert processes_mentioning(str(tmp_path / "runs")) == []

    rerun = subprocess.run([sys.executable, "-m", "autotune", "run", str(path)],
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    trials = optuna.load_study(study_name="kill", storage=storage).get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    # Every trial that was running when the runner died (with trial.batch_size > 1, the
    # whole batch in its launch) is failed once, and measured again.
    assert sorted(str(t.params) for t in failed) == killed
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert killed_layout in [t.params for t in complete]  # retried and measured
    assert all(t.params in [c.params for c in complete] for t in failed)
    assert len(complete) == 2
    assert len({t.user_attrs["layout"] for t in complete}) == 2
