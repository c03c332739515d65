"""Many workers on one study in a shared SQL database: each trial recorded exactly once,
none left RUNNING (PostgreSQL with 16 workers), and the MySQL/MariaDB URL works too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from autotune.config.study import StorageConfig
from autotune.storage.db import Storage
from tests.helpers import REPO, write_study

N_WORKERS = 16


def run_workers(study: Path, n: int) -> list[subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.storage._fast_worker", str(study)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=REPO) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def check_exactly_once(url: str, name: str, n_trials: int) -> None:
    storage = Storage(StorageConfig(url=url))
    try:
        study = optuna.load_study(study_name=name, storage=storage.optuna)
        trials = study.get_trials(deepcopy=False)
        assert not [t for t in trials if t.state == TrialState.RUNNING]
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        assert len(complete) == n_trials
        keys = [t.user_attrs.get("layout") for t in complete]
        assert len(set(keys)) == n_trials, "a layout was measured twice"
        assert len(storage.claimed_keys(name)) == n_trials
    finally:
        storage.close()
    engine = create_engine(url)
    with engine.connect() as c:
        rows = c.execute(text("select trial_id, count(*) from measurements where study_name = :n"
                              " group by trial_id"), {"n": name}).all()
    engine.dispose()
    assert len(rows) == n_trials and all(cnt == 1 for _, cnt in rows), rows


def study_file(tmp_path: Path, url: str, name: str, n_trials: int) -> Path:
    return write_study(tmp_path / "study.yaml", name=name, devices=8, n_trials=n_trials,
                       search={"tp": [1, 2, 4], "pp": [1, 2], "micro_batch": [1, 2, 4, 8],
                               "zero_stage": [0, 1], "recompute": ["none", "full"],
                               "n_trials": n_trials},
                       training={"global_batch": 16, "dtype": "fp32"},
                       storage={"url": url, "heartbeat_interval_s": 2, "grace_period_s": 30})


@pytest.mark.postgres
@pytest.mark.slow
def test_16_workers_on_postgres_record_each_trial_once(tmp_path: Path, pg_url: str,
                                                       unique: str) -> None:
    name, n_trials = f"pg16-{unique}", 24
    path = study_file(tmp_path, pg_url, name, n_trials)
    done = run_workers(path, N_WORKERS)
    for d in done:
        assert d.returncode == 0, d.stderr[-2000:]
    check_exactly_once(pg_url, name, n_trials)


@pytest.mark.slow
def test_mysql_url_runs_a_study(tmp_path: Path, mysql_url: str, unique: str) -> None:
    name, n_trials = f"my-{unique}", 4
    path = study_file(tmp_path, mysql_url, name, n_trials)
    done = run_workers(path, 2)
    for d in done:
        assert d.returncode == 0, d.stderr[-2000:]
    check_exactly_once(mysql_url, name, n_trials)
