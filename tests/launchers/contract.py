"""The launcher contract test, written once and run against every launcher.

Subclass :class:`LauncherContract` and provide the ``launcher`` fixture (and, for
launchers that start no processes, ``supports_processes = False``). See
``autotune/launchers/base.py`` for the contract itself. Run against the local launcher
(``test_local.py``), the SLURM launcher (``test_slurm.py``) and the replay launcher
(``test_replay.py``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.trial import TrialPaths, TrialSpec
from autotune.trial.classify import classify
from tests.helpers import no_processes_mentioning, tiny_spec


class LauncherContract:
    """Every launcher: success, a failed trial reported without raising, timeout kill, cancel."""

    supports_processes = True
    """False for launchers that answer instantly (replay): no timeout/cancel checks."""

    def spec(self, **run: object) -> TrialSpec:
        """The spec each check runs; launchers override to fit their candidates."""
        return tiny_spec(**run)  # type: ignore[arg-type]

    def failing_spec(self) -> TrialSpec:
        """A spec whose trial fails: the trainer's injected OOM, on one rank. (With two,
        the other rank waits in its all-reduce for the one that raised until the
        process-group timeout, ``collective_timeout_s``, 300 s by default, before the
        trial can say ``oom``: tests/trainer covers that with a short timeout.)"""
        return tiny_spec(Layout(tp=1, pp=1, dp=1, micro_batch=1, grad_accum=2), test_hook="oom")

    def test_success_writes_result(self, launcher: Launcher, tmp_path: Path) -> None:
        paths = TrialPaths(tmp_path / "ok")
        report = launcher.run(self.spec(), paths, timeout_s=300)
        assert report.result is not None, report.stderr_tail
        assert report.result.status == "ok", report.result.error
        outcome = classify(report)
        assert outcome.kind == "complete" and outcome.value and outcome.value > 0
        assert paths.spec.exists() and paths.report.exists()

    def test_a_failed_trial_is_reported_not_raised(self, launcher: Launcher,
                                                   tmp_path: Path) -> None:
        paths = TrialPaths(tmp_path / "oom")
        report = launcher.run(self.failing_spec(), paths, timeout_s=300)
        assert report.result is not None, report.stderr_tail
        assert report.result.status == "oom"
        assert classify(report).kind == "oom"
        assert paths.report.exists()

    def test_timeout_kills_everything(self, launcher: Launcher, tmp_path: Path) -> None:
        if not self.supports_processes:
            pytest.skip("this launcher starts no processes: nothing to time out")
        paths = TrialPaths(tmp_path / "hang")
        started = time.monotonic()
        report = launcher.run(self.spec(test_hook="hang"), paths, timeout_s=25)
        assert report.timed_out
        assert time.monotonic() - started < 25 + 30
        assert classify(report).kind == "timeout"
        assert no_processes_mentioning(str(paths.root)) == []

    def test_cancel_returns_promptly(self, launcher: Launcher, tmp_path: Path) -> None:
        if not self.supports_processes:
            pytest.skip("this launcher starts no processes: nothing to cancel")
        paths = TrialPaths(tmp_path / "cancel")
        timer = threading.Timer(4.0, launcher.cancel)
        timer.start()
        started = time.monotonic()
        report = launcher.run(self.spec(test_hook="hang"), paths, timeout_s=300)
        timer.cancel()
        assert report.interrupted
        assert time.monotonic() - started < 40
        assert classify(report).kind == "interrupted"
        assert no_processes_mentioning(str(paths.root)) == []

    def test_a_batch_reports_each_trial_and_reruns_only_the_unfinished(
            self, launcher: Launcher, tmp_path: Path) -> None:
        """Contract 6: one launch for the batch; a trial that kills the launch (rank 0's
        process exits, as after a segfault) is run again alone, and so is every trial
        after it; the trial before it keeps the result it wrote in the batch."""
        specs = [self.spec(), self.spec(test_hook="die") if self.supports_processes
                 else self.spec(), self.spec()]
        paths = [TrialPaths(tmp_path / f"member{i}") for i in range(3)]
        reports = launcher.run_batch(specs, paths, timeout_s=300)
        assert len(reports) == 3
        first, dead, last = reports
        assert first.result is not None and first.result.status == "ok", first.stderr_tail
        assert all(p.report.exists() for p in paths)
        if not launcher.batches:
            return  # one by one: nothing shared to check
        assert first.batch is not None and not first.batch["rerun"]
        assert first.result.batch_index == 0 and first.result.batch_size == 3
        assert dead.batch is not None and dead.batch["rerun"]
        assert classify(dead).kind == "error"  # alone it dies again: charged to itself
        assert last.batch is not None and last.batch["rerun"]
        assert last.result is not None and last.result.status == "ok"
        assert last.result.batch_size == 1  # measured alone, not in the dead launch
        assert no_processes_mentioning(str(tmp_path)) == []
