"""Several `autotune run` workers on one SQLite study: the budget is met exactly, every
layout is measured once, every trial is recorded once, none is left running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from tests.helpers import write_study

pytestmark = pytest.mark.slow


def test_four_workers_share_one_sqlite_study(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    path = write_study(tmp_path / "s.yaml", name="shared", devices=1, db=db, n_trials=6,
                       search={"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8],
                               "zero_stage": [0, 1], "recompute": ["none"], "n_trials": 6})
    workers = [subprocess.Popen([sys.executable, "-m", "autotune", "run", str(path), "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(4)]
    for w in workers:
        _, err = w.communicate(timeout=600)
        assert w.returncode == 0, err

    trials = optuna.load_study(study_name="shared", storage=f"sqlite:///{db}").get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 6
    keys = [t.user_attrs["layout"] for t in complete]
    assert len(set(keys)) == 6  # no layout measured twice
    assert len({t.user_attrs["worker"] for t in complete}) >= 2  # the work was shared
    with create_engine(f"sqlite:///{db}").connect() as conn:
        rows = conn.execute(text("select trial_id, layout_key from measurements")).all()
    assert len(rows) == 6 and len({r[0] for r in rows}) == 6  # one row per execution
    assert {r[1] for r in rows} == set(keys)
