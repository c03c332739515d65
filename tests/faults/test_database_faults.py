"""A study survives its database's bad days (issue 23 A, B, C), reproduced as they happen
on a cluster: an immediate PostgreSQL stop and restart (crash recovery) during a real CPU
trial and during 8 replay workers; a worker frozen (SIGSTOP) inside its claim's
transaction, on SQLite and on PostgreSQL; a full disk under SQLite.

The PostgreSQL cases use a server of the suite's own (``own_pg``: initdb, its own port),
never the machine's. Each case ends with a rerun that finds the budget reached, and the
study's invariants (:func:`tests.faults.harness.invariants`); no output has a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import autotune.launchers.replay  # noqa: F401 (imported once here, not in each forked run)
from autotune.runner.worker import TEST_STOP_ENV
from tests.faults.harness import (
    assert_clean,
    count,
    fork_run,
    invariants,
    process_state,
    set_storage,
    wait_for,
)
from tests.faults.pg_server import PgServer
from tests.helpers import write_study
from tests.replay_study import own_pg_database, write_replay_study

pytestmark = [pytest.mark.faults, pytest.mark.slow]

RETRY_LINE = "; retry 1 in "
"""What a worker prints when it waits out a database failure (storage.transient)."""


def _claims(url: str, name: str) -> int:
    return count(url, "select count(*) from layout_claims where study_name = :n", n=name)


def test_an_immediate_restart_during_a_real_cpu_trial_loses_no_result(
        tmp_path: Path, own_pg: PgServer) -> None:
    """Issue 23 A: the server stops (``-m immediate``) while a launch of 3 layouts runs and
    is back once the launch has ended and the runner waits to record: the three results
    are recorded, none is measured again."""
    with own_pg_database(own_pg.url, "restart_cpu") as url:
        study = write_study(tmp_path / "cpu.yaml", name="restart-cpu", n_trials=3,
                            trial={"warmup_steps": 1, "measure_steps": 2,
                                   "max_measure_steps": 2, "timeout_s": 180, "device": "cpu"},
                            storage={"url": url, "heartbeat_interval_s": 1,
                                     "grace_period_s": 120, "outage_wait_s": 240})
        log = tmp_path / "run.log"
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", str(study),
                                     "--quiet"], stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            runs = tmp_path / "runs" / "restart-cpu"
            wait_for("the launch", lambda: runs.is_dir() and any(runs.iterdir()), 300)
            own_pg.stop("immediate")
            wait_for("the runner to wait for the database",
                     lambda: RETRY_LINE in log.read_text(), 300)
            assert len(list(runs.glob("*/result.json"))) == 3  # measured while it was down
            assert own_pg.start() is None
            assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
            own_pg.start()  # in case the test failed while it was down (else a no-op)
        again = subprocess.run([sys.executable, "-m", "autotune", "run", str(study),
                                "--quiet"], capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        (tmp_path / "again.log").write_text(again.stdout + again.stderr)
        assert_clean(log, tmp_path / "again.log")
        counts = invariants(url, "restart-cpu", 3)
        assert counts == {"trials": 3, "complete": 3, "killed": 0}, counts


def test_an_immediate_restart_under_8_replay_workers(tmp_path: Path, own_pg: PgServer) -> None:
    """Issue 23 A/B: 1 of 8 workers ended with a traceback on an immediate stop; now
    every worker waits it out and the study ends at its budget."""
    n = 24
    with own_pg_database(own_pg.url, "restart_replay") as url:
        # A lease longer than the outage: the point is that nobody is repaired as killed.
        study = write_replay_study(tmp_path, name="restart8", url=url, n_trials=n,
                                   heartbeat_s=2, grace_s=60)
        logs = [tmp_path / f"worker{i}.log" for i in range(8)]
        workers = [fork_run(study, log) for log in logs]
        wait_for("the first claims", lambda: _claims(url, "restart8") >= 6, 120)
        down_s = own_pg.restart_immediately()
        for w in workers:
            w.join(300)
        outputs = {log.name: log.read_text() for log in logs}
        assert [w.exitcode for w in workers] == [0] * 8, outputs
        assert any(RETRY_LINE in text for text in outputs.values()), outputs
        rerun = fork_run(study, tmp_path / "rerun.log")
        rerun.join(120)
        assert rerun.exitcode == 0
        assert_clean(*logs, tmp_path / "rerun.log")
        counts = invariants(url, "restart8", n)
        print(f"down {down_s:.2f} s; {counts}")
        assert counts["killed"] == 0, counts


@contextmanager
def _frozen_in_its_claim(study: Path, log: Path) -> Iterator[int]:
    """A worker that SIGSTOPs itself inside its first claim's transaction (its locks held);
    its pid once it is stopped. Killed at the end if the test left it."""
    frozen = fork_run(study, log, env={TEST_STOP_ENV: "in-claim"})
    assert frozen.pid is not None
    pid = frozen.pid
    try:
        wait_for("the worker to stop in its claim", lambda: process_state(pid) == "T")
        yield pid
    finally:
        if process_state(pid):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
            frozen.join(10)


def _woken(pid: int) -> int:
    """SIGCONT; the exit code."""
    os.kill(pid, signal.SIGCONT)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_worker_frozen_in_its_claim_on_postgresql_stops_nobody(
        tmp_path: Path, own_pg: PgServer) -> None:
    """Issue 23 C: the frozen backend stayed "idle in transaction" and three workers
    waited on its row lock for ever. The server ends its session after
    ``transaction_timeout_s``, the others go on to the budget while it is still stopped,
    and once woken it finds its claim gone and records nothing of it."""
    n = 12
    with own_pg_database(own_pg.url, "frozen_pg") as url:
        study = set_storage(write_replay_study(tmp_path, name="frozen-pg", url=url,
                                               n_trials=n, heartbeat_s=2, grace_s=60),
                            transaction_timeout_s=2)
        frozen_log = tmp_path / "frozen.log"
        logs = [tmp_path / f"worker{i}.log" for i in range(3)]
        with _frozen_in_its_claim(study, frozen_log) as pid:
            others = [fork_run(study, log) for log in logs]
            for w in others:
                w.join(180)
            assert process_state(pid) == "T"  # all that while
            assert [w.exitcode for w in others] == [0] * 3, [log.read_text() for log in logs]
            assert _claims(url, "frozen-pg") == n
            assert _woken(pid) == 0, frozen_log.read_text()
        assert "ended this worker's transaction" in frozen_log.read_text() \
            or "closed the connection" in frozen_log.read_text(), frozen_log.read_text()
        rerun = fork_run(study, tmp_path / "rerun.log")
        rerun.join(120)
        assert rerun.exitcode == 0
        assert_clean(frozen_log, *logs, tmp_path / "rerun.log")
        counts = invariants(url, "frozen-pg", n)
        assert counts["killed"] == 0, counts


def test_a_worker_frozen_in_its_claim_on_sqlite_is_named_and_waited_for(
        tmp_path: Path) -> None:
    """Issue 23 C on SQLite, whose lock no one can take from a live process: the others
    retry with one line each, give up after ``outage_wait_s`` with one clear line and
    exit 1 (they exited after 120 s with "database is locked"); the frozen worker, woken,
    finishes the study."""
    n = 10
    url = f"sqlite:///{tmp_path / 'frozen.db'}"
    study = set_storage(write_replay_study(tmp_path, name="frozen-sqlite", url=url,
                                           n_trials=n, heartbeat_s=2, grace_s=60),
                        transaction_timeout_s=1, outage_wait_s=1)
    frozen_log = tmp_path / "frozen.log"
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    with _frozen_in_its_claim(study, frozen_log) as pid:
        others = [fork_run(study, log) for log in logs]
        for w in others:
            w.join(120)
        assert [w.exitcode for w in others] == [1, 1]
        for log in logs:
            text = log.read_text()
            assert "is locked by another process" in text and RETRY_LINE in text, text
            last = text.strip().splitlines()[-1]
            assert last.startswith("autotune: error:") and "gave up after waiting" in last
        assert _woken(pid) == 0, frozen_log.read_text()
    rerun = fork_run(study, tmp_path / "rerun.log")
    rerun.join(120)
    assert rerun.exitcode == 0
    assert_clean(frozen_log, *logs, tmp_path / "rerun.log")
    counts = invariants(url, "frozen-sqlite", n)
    assert counts["killed"] == 0, counts


def test_a_resume_on_a_full_disk_exits_1_in_one_line(tmp_path: Path, small_tmpfs: Path) -> None:
    """Issue 23 B: a resume on a full disk printed a traceback. It says so in one line,
    exit 1, stores nothing half-written, and resumes once there is room."""
    url = f"sqlite:///{small_tmpfs / 'full.db'}"
    study = write_replay_study(tmp_path, name="full", url=url, n_trials=3)
    first = fork_run(study, tmp_path / "first.log")
    first.join(120)
    assert first.exitcode == 0
    filler = small_tmpfs / "filler"
    with filler.open("wb") as f:  # the disk fills up
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    full = fork_run(study, tmp_path / "full.log", "--n-trials", "10")
    full.join(120)
    text = (tmp_path / "full.log").read_text()
    assert full.exitcode == 1, text
    assert "database or disk is full" in text.strip().splitlines()[-1], text
    filler.unlink()
    again = fork_run(study, tmp_path / "again.log", "--n-trials", "10")
    again.join(120)
    assert again.exitcode == 0, (tmp_path / "again.log").read_text()
    assert_clean(tmp_path / "first.log", tmp_path / "full.log", tmp_path / "again.log")
    counts = invariants(url, "full", 10)
    assert counts["killed"] == 0, counts


def test_each_postgresql_connection_carries_its_limits(own_pg: PgServer) -> None:
    from sqlalchemy import text

    from autotune.config.study import StorageConfig
    from autotune.storage.db import Storage

    storage = Storage(StorageConfig(url=own_pg.url, transaction_timeout_s=7))
    with storage.engine.connect() as conn:
        shown = [conn.execute(text(f"SHOW {name}")).scalar() for name in (
            "idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout")]
    storage.close()
    assert shown == ["7s", "14s", "14s"]


def test_sessions_terminated_every_0_7_s_and_immediate_restarts_under_6_workers(
        tmp_path: Path, own_pg: PgServer) -> None:
    """Every 0.7 s every session of the study's database is terminated
    (``pg_terminate_backend``: SQLSTATE 57P01 to its holder), and twice the server stops
    at once and starts again: each of 6 replay workers waits it out and exits 0, nothing
    is measured twice, nothing stays RUNNING (:func:`invariants`). The end-of-run reads
    used to go around the retry layer: 2-3 of 6 workers exited 1."""
    import threading

    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    n = 18
    with own_pg_database(own_pg.url, "terminated6") as url:
        study = write_replay_study(tmp_path, name="terminated6", url=url, n_trials=n,
                                   heartbeat_s=2, grace_s=60)
        stop, terminated = threading.Event(), [0]

        def terminator() -> None:
            engine = create_engine(url, poolclass=NullPool)
            try:
                while not stop.wait(0.7):
                    try:
                        with engine.connect() as conn:
                            terminated[0] += int(conn.execute(text(
                                "select count(pg_terminate_backend(pid)) from "
                                "pg_stat_activity where datname = current_database() "
                                "and pid <> pg_backend_pid()")).scalar() or 0)
                    except Exception:  # the server is restarting: next tick
                        pass
            finally:
                engine.dispose()

        logs = [tmp_path / f"worker{i}.log" for i in range(6)]
        killer = threading.Thread(target=terminator, daemon=True)
        workers = [fork_run(study, log) for log in logs]
        killer.start()
        try:
            wait_for("the first claims", lambda: _claims(url, "terminated6") >= 3, 120)
            own_pg.restart_immediately()
            wait_for("more claims", lambda: _claims(url, "terminated6") >= 9, 180)
            own_pg.restart_immediately()
            for w in workers:
                w.join(300)
        finally:
            stop.set()
            killer.join(10)
            own_pg.start()
        failed = {log.name: log.read_text()[-4000:] for log, w in zip(logs, workers, strict=True)
                  if w.exitcode != 0}
        assert not failed, "\n".join(f"--- {k} ---\n{v}" for k, v in failed.items())
        assert terminated[0] > 0
        assert_clean(*logs)
        counts = invariants(url, "terminated6", n)
        print(f"terminated {terminated[0]} sessions; {counts}")
