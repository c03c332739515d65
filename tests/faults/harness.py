"""What every fault case runs and checks: runners forked from this process (their start-up
is not what is tested), their output in files, and the study's invariants afterwards:
the budget reached, no trial RUNNING, no layout measured twice, no execution without its
``measurements`` row, no traceback anywhere (issue 23, "How it is checked")."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

_FORK = multiprocessing.get_context("fork")


def set_storage(study: Path, **fields: Any) -> Path:
    """The study file with these ``storage`` fields changed."""
    data = yaml.safe_load(study.read_text())
    data["storage"].update(fields)
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    return study


def _runner(args: list[str], log: str, env: Mapping[str, str]) -> None:
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ.update(env)
    from autotune.cli import main

    code = main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fork_run(study: Path, log: Path, *extra: str,
             env: Mapping[str, str] | None = None) -> multiprocessing.Process:
    """``autotune run STUDY --quiet EXTRA`` in a forked process, its output to ``log``."""
    proc = _FORK.Process(target=_runner, args=(["run", str(study), "--quiet", *extra],
                                               str(log), dict(env or {})))
    proc.start()
    return proc


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = 120,
             poll_s: float = 0.1) -> None:
    """Poll ``ready`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def process_state(pid: int) -> str:
    """``R``, ``S``, ``T`` (stopped), ``Z``, ... of a live process; ``""`` if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def count(url: str, sql: str, **params: Any) -> int:
    """One number from the database, on a connection of its own (the server may be
    restarting under the test); -1 when it cannot be reached."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql), params).scalar() or 0)
    except Exception:  # the server is down or recovering: not a number yet
        return -1
    finally:
        engine.dispose()


def assert_clean(*logs: Path) -> None:
    """No traceback in any output, and at most one ``autotune: error:`` line each."""
    for log in logs:
        out = log.read_text() if log.exists() else ""
        assert "Traceback" not in out, f"{log.name}:\n{out[-3000:]}"
        errors = [line for line in out.splitlines() if line.startswith("autotune: error:")]
        assert len(errors) <= 1, f"{log.name}: {errors}"


def invariants(url: str, name: str, n_trials: int) -> dict[str, int]:
    """The study's invariants after its last run; counts for messages."""
    trials = optuna.load_study(study_name=name, storage=url).get_trials()
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    engine = create_engine(url, poolclass=NullPool)
    with engine.connect() as conn:
        claims = conn.execute(text("select layout_key, attempts, retry, lease_until "
                                   "from layout_claims where study_name = :n"), {"n": name}).all()
        rows = conn.execute(text("select trial_id, layout_key, outcome from measurements "
                                 "where study_name = :n"), {"n": name}).all()
    engine.dispose()
    assert len(claims) == n_trials  # the budget, exactly
    assert not [c for c in claims if c.retry or c.lease_until is not None]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    keys = [t.user_attrs["layout"] for t in complete]
    assert len(keys) == len(set(keys)), Counter(keys).most_common(3)  # none measured twice
    assert set(keys) == {c.layout_key for c in claims}
    per_trial = Counter(r.trial_id for r in rows)
    assert set(per_trial.values()) == {1}
    by_id = {t._trial_id: t for t in trials}
    for r in rows:
        assert r.outcome == by_id[r.trial_id].user_attrs["outcome"]
    return {"trials": len(trials), "complete": len(complete),
            "killed": sum(r.outcome == "killed" for r in rows)}
