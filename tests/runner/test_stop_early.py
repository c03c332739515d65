"""The stop-early rule (autotune.runner.stop_early): trials that fail alike on different
layouts stop the study; a resumed study asks for --retry-failed or a changed file."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest

from autotune.runner.stop_early import RepeatedErrorRule, failure_of
from autotune.spec import load_study
from autotune.trial.outcome import Verdict
from tests.helpers import REPO, run_cli, write_study

PROGRAMS = REPO / "tests" / "workloads" / "programs"
TYPO = "unrecognized arguments: --micro-bach 1"


def _fail(rule: RepeatedErrorRule, number: int, layout: str, reason: str) -> object:
    outcome = Verdict("error", reason=reason)
    return rule.observe("error", failure_of(outcome, number=number, layout=layout,
                                            trial_dir=f"runs/t{number}"))


def test_two_alike_failures_on_different_layouts_stop() -> None:
    rule = RepeatedErrorRule(2)
    assert _fail(rule, 0, "a", f"x.py: error: {TYPO}\n(exit code 2)") is None
    broken = _fail(rule, 1, "b", f"x.py: error: {TYPO}\n(exit code 2)")
    assert broken is not None and TYPO in broken.message() and "runs/t1" in broken.message()


@pytest.mark.parametrize("between", ["complete", "oom", "other-error", "same-layout"])
def test_anything_else_between_them_restarts_the_count(between: str) -> None:
    rule = RepeatedErrorRule(2)
    assert _fail(rule, 0, "a", "RuntimeError: broken at step 3") is None
    if between in ("complete", "oom"):
        assert rule.observe(between, None) is None
    elif between == "other-error":
        assert _fail(rule, 1, "b", "ValueError: something else") is None
    else:
        assert _fail(rule, 1, "a", "RuntimeError: broken at step 4") is None  # a retry
    assert (_fail(rule, 2, "c", "RuntimeError: broken at step 9") is None) \
        == (between != "same-layout")
    # Unjudged trials neither count nor break the row; the numbers in it do not matter.
    assert rule.observe("interrupted", None) is None


def test_off_with_zero() -> None:
    rule = RepeatedErrorRule(0)
    assert all(_fail(rule, i, str(i), "RuntimeError: x") is None for i in range(5))


@pytest.mark.slow
def test_a_misspelled_flag_stops_a_command_study_and_its_resume_asks_first(
        tmp_path: Path) -> None:
    argv = [sys.executable, str(PROGRAMS / "fake_trainer.py"), "--steps", "{train_iters}",
            "--micro-bach", "{micro_batch}"]
    workload = {"kind": "command", "argv": argv, "env": {"PYTHONPATH": str(REPO)}}
    search = {"tp": [1], "pp": [1], "zero_stage": [0], "recompute": ["none"],
              "strategy": "cost-model-only", "micro_batch": [1, 2, 4, 8], "n_trials": 4}
    path = write_study(tmp_path / "typo.yaml", name="typo", devices=1, n_trials=4,
                       search=search, workload=workload)
    proc = run_cli("run", str(path), timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "unrecognized arguments: --micro-bach" in proc.stderr
    url = load_study(path).storage.url

    def trials() -> list[optuna.trial.FrozenTrial]:
        return optuna.load_study(study_name="typo", storage=url).get_trials()

    assert len(trials()) == 2
    assert all("fake_trainer.py: error: unrecognized arguments: --micro-bach"
               in t.user_attrs["reason"].splitlines()[0] for t in trials())
    # Resumed as it is: refused before any trial is spent.
    again = run_cli("run", str(path), timeout=300)
    assert again.returncode == 2 and "--retry-failed" in again.stderr, again.stderr[-2000:]
    assert len(trials()) == 2
    # --retry-failed measures those layouts again (and stops again: still broken).
    retried = run_cli("run", str(path), "--retry-failed", timeout=300)
    assert retried.returncode == 1, retried.stderr[-2000:]
    assert len(trials()) == 4
