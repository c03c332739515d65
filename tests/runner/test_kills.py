"""A study survives SIGKILL at any instant (issue #17), on SQLite and on PostgreSQL.

The runner (``autotune run``, forked from this already-importing process so that a kill
lands in the loop, not in Python's start-up) is SIGKILLed at random instants, each kill
followed by another run, over a replay study (trials cost nothing); then runs go on to
the end. Whatever the instants: the budget is reached, nothing is RUNNING, no layout is
measured twice, every measured layout is one COMPLETE Optuna trial, and every execution
(killed ones too) has exactly one ``measurements`` row that agrees with its trial. The
runner's test hook (``AUTOTUNE_TEST_KILL_AT``) hits the two narrowest windows exactly:
between the claim and the launch, and inside the record's transaction.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import alembic.migration  # noqa: F401 (imported once here, not in each forked run)
import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from autotune.cli import main
from autotune.launchers.replay import ReplayLauncher
from autotune.runner.worker import TEST_KILL_ENV, Worker
from tests.replay_study import own_pg_database, write_replay_study

pytestmark = pytest.mark.slow

N_TRIALS = 100
KILLS = 100
EXECUTION_S = 0.05
"""How long a replayed execution lasts under the random kills (``_runner``)."""
_FORK = multiprocessing.get_context("fork")


def _runner(study: str, kill_at: str | None, ready: Any, executing: Any = None) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    if kill_at:
        os.environ[TEST_KILL_ENV] = kill_at
    if ready is not None:
        # Tell the parent when the loop starts (start-up takes 1-3 s on a loaded 2-core
        # machine, and most kill instants should fall inside the loop, not before it).
        step = Worker._step

        def told(self: Worker) -> Any:
            ready.set()
            return step(self)

        Worker._step = told  # type: ignore[method-assign]
        # A replayed execution takes microseconds where a real one takes seconds, so a
        # random kill would land inside one only by luck (0 of 100 in a CI run): it lasts
        # EXECUTION_S here, a stand-in for a trial that takes time, and the kill instants
        # reach executions as they would on a real study.
        run = ReplayLauncher.run

        def lasting(self: ReplayLauncher, *args: Any, **kwargs: Any) -> Any:
            if executing is not None:
                executing.set()
            time.sleep(EXECUTION_S)
            return run(self, *args, **kwargs)

        ReplayLauncher.run = lasting  # type: ignore[method-assign]
    os._exit(main(["run", study, "--quiet"]))


def _start(study: Path, kill_at: str | None = None, ready: Any = None,
           executing: Any = None) -> multiprocessing.Process:
    proc = _FORK.Process(target=_runner, args=(str(study), kill_at, ready, executing))
    proc.start()
    return proc


def _finish(study: Path, timeout: float = 300) -> int:
    proc = _start(study)
    proc.join(timeout)
    assert proc.exitcode is not None, "a run after the kills did not end"
    return proc.exitcode


def _wait(event: Any, proc: multiprocessing.Process, timeout: float = 30) -> None:
    """Wait for ``event``, or for the run to end without it: once the budget is reached a
    run exits before its loop's first execution, and waiting the whole timeout for an event
    that cannot come cost 30 s of each test."""
    deadline = time.monotonic() + timeout
    while not event.wait(0.02) and proc.is_alive() and time.monotonic() < deadline:
        pass


def _kill_randomly(study: Path, kills: int, seed: int) -> None:
    """One kill in ten at an instant of the start-up (open, migrate, calibrate), one in ten
    at an instant of an execution (the first one's EXECUTION_S: how long the loop takes to
    reach it varies with the machine's load, so it is waited for), the others at an instant
    of the loop's first 0.3 s (repair, claim, launch, record, propose)."""
    rng = random.Random(seed)
    for i in range(kills):
        ready, executing = _FORK.Event(), _FORK.Event()
        proc = _start(study, ready=ready, executing=executing)
        if i % 10 == 0:
            time.sleep(rng.uniform(0.0, 1.0))
        elif i % 10 == 5:
            _wait(executing, proc)
            time.sleep(rng.uniform(0.0, EXECUTION_S))
        else:
            _wait(ready, proc)
            time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()  # SIGKILL, unless _wait has seen the run end by itself
        proc.join(10)


def _check(url: str, name: str) -> dict[str, int]:
    """The invariants; returns counts for the message."""
    trials = optuna.load_study(study_name=name, storage=url).get_trials()
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    engine = create_engine(url)
    with engine.connect() as conn:
        claims = conn.execute(text("select layout_key, trial_id, attempts, retry, lease_until "
                                   "from layout_claims where study_name = :n"), {"n": name}).all()
        rows = conn.execute(text("select trial_id, layout_key, outcome from measurements "
                                 "where study_name = :n"), {"n": name}).all()
    engine.dispose()
    assert len(claims) == N_TRIALS  # the budget, exactly
    assert not [c for c in claims if c.retry or c.lease_until is not None]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    keys = [t.user_attrs["layout"] for t in complete]
    assert len(keys) == len(set(keys))  # no layout measured twice
    # Every layout is measured, unless it was killed at each of its attempts.
    exhausted = [c.layout_key for c in claims if c.attempts >= 3 and c.layout_key not in keys]
    assert set(keys) | set(exhausted) == {c.layout_key for c in claims}
    # One measurements row per execution, and it says what its trial says.
    per_trial = Counter(r.trial_id for r in rows)
    assert set(per_trial.values()) == {1}
    by_id = {t._trial_id: t for t in trials}
    assert set(per_trial) == {t._trial_id for t in trials if t.user_attrs.get("outcome")
                              not in ("infeasible",)}
    for r in rows:
        trial = by_id[r.trial_id]
        assert r.outcome == trial.user_attrs["outcome"]
        assert r.layout_key == trial.user_attrs["layout"]
        assert (r.outcome == "complete") == (trial.state == TrialState.COMPLETE)
    # Each measured layout's COMPLETE trial carries its value and full attributes.
    assert all(t.value is not None and "step_time_s" in t.user_attrs for t in complete)
    return {"trials": len(trials), "complete": len(complete), "killed":
            sum(r.outcome == "killed" for r in rows), "exhausted": len(exhausted)}


def _random_kills(tmp_path: Path, url: str, seed: int) -> dict[str, int]:
    study = write_replay_study(tmp_path, name="kills", url=url, n_trials=N_TRIALS)
    _kill_randomly(study, KILLS, seed)
    for _ in range(5):  # a run ends at the budget; one more finds nothing left to do
        _finish(study)
    counts = _check(url, "kills")
    print(counts)
    # The kills did land inside executions (the rest hit start-up, proposals and claims,
    # which leave no killed trial). How many of the 0.3 s window's land there depends on how
    # long the loop spends outside an execution on a loaded machine (0 of 90 in one CI run);
    # the ten timed from an execution's start do, whatever the load: the check asks that.
    assert counts["killed"] >= 1, counts
    return counts


def test_a_hundred_random_sigkills_on_sqlite(tmp_path: Path) -> None:
    _random_kills(tmp_path, f"sqlite:///{tmp_path / 'kills.db'}", seed=1)


@pytest.mark.postgres
def test_a_hundred_random_sigkills_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    with own_pg_database(pg_url, "kills") as url:
        _random_kills(tmp_path, url, seed=2)


@pytest.mark.parametrize("point", ["after-claim", "in-record"])
def test_sigkill_between_claim_and_launch_and_inside_the_record(tmp_path: Path,
                                                                point: str) -> None:
    url = f"sqlite:///{tmp_path / 'hook.db'}"
    study = write_replay_study(tmp_path, name="hook", url=url, n_trials=N_TRIALS)
    for _ in range(2):  # the same layout twice: its retry is killed too
        proc = _start(study, kill_at=point)
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL
    engine = create_engine(url)
    with engine.connect() as conn:
        outcomes = [r[0] for r in conn.execute(text("select outcome from measurements "
                                                    "order by trial_id"))]
    engine.dispose()
    assert outcomes == ["killed", "running"]  # the 2nd run repaired the 1st at its start
    assert _finish(study) == 0
    counts = _check(url, "hook")
    assert counts["killed"] == 2
    trials = optuna.load_study(study_name="hook", storage=url).get_trials()
    # The killed layout is re-run first, each retry naming the execution it repeats; its
    # third execution is its last (storage.claims.MAX_ATTEMPTS).
    assert [t.user_attrs.get("retry_of") for t in trials[:3]] == [None, 0, 1]
    assert len({t.user_attrs["layout"] for t in trials[:3]}) == 1
    assert trials[2].state == TrialState.COMPLETE


def test_a_study_whose_last_trial_was_killed_is_not_done(tmp_path: Path) -> None:
    """The issue's case: SIGKILL during a study's last trial; a rerun said "budget reached"
    and ``campaign check`` said done, at 1/2 measured with a trial RUNNING for ever."""
    from autotune.campaign.jobs import study_progress

    url = f"sqlite:///{tmp_path / 'last.db'}"
    study = write_replay_study(tmp_path, name="last", url=url, n_trials=1)
    proc = _start(study, kill_at="after-claim")
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    progress = study_progress(url, "last")  # repairs first: the dead runner was here
    assert (progress.claimed, progress.running, progress.waiting) == (1, 0, 1)
    assert not progress.done(1, None)
    assert _finish(study) == 0
    assert study_progress(url, "last").done(1, None)
    trials = optuna.load_study(study_name="last", storage=url).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
