"""The narrow read of a study's finished trials (autotune/storage/judged.py) gives what
Optuna's whole read gives for them: number, state, value, layout and outcome, in order,
and the strategy's observations of both are the same (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.study import StorageConfig
from autotune.layout import Layout
from autotune.runner.optuna_io import observations
from autotune.runner.progress import trials_table
from autotune.storage.db import open_storage
from autotune.storage.judged import FINISHED, SUMMARY_KEYS, judged_trials, read_best_trial
from autotune.storage.records import best_trial, trial_layout, trial_outcome

OUTCOMES = ("complete", "stopped", "oom", "error", "infeasible", "timeout", "killed")


def _fill(study: optuna.Study, rng: random.Random) -> None:
    for i in range(40):
        trial = study.ask()
        lay = Layout(tp=rng.choice([1, 2]), pp=rng.choice([1, 2]), dp=1,
                     micro_batch=rng.choice([1, 2, 4]), grad_accum=1 + i % 3)
        if rng.random() < 0.9:  # a few trials were never judged: no attributes
            trial.set_user_attr("layout", lay.key())
            trial.set_user_attr("layout_dict", lay.to_dict())
            trial.set_user_attr("outcome", rng.choice(OUTCOMES))
        trial.set_user_attr("timings_s", {"measure": rng.random()})  # read by neither
        trial.set_user_attr("step_time_s", rng.random())
        trial.set_user_attr("reason", f"reason {i}\nsecond line")
        roll = rng.random()
        if roll < 0.5:
            study.tell(trial, rng.choice([rng.uniform(1, 300), float("inf")]))
        elif roll < 0.65:
            study.tell(trial, state=TrialState.PRUNED)
        elif roll < 0.85:
            study.tell(trial, state=TrialState.FAIL)
        # else: left RUNNING, which the finished-only read leaves out


def _check(url: str, name: str) -> None:
    storage = open_storage(StorageConfig(url=url))
    try:
        study = optuna.create_study(study_name=name, storage=storage.optuna,
                                    direction="maximize")
        _fill(study, random.Random(name))
        whole = study.get_trials(deepcopy=False, states=FINISHED)
        narrow = judged_trials(storage, name)
        assert len(narrow) == len(whole) > 20
        for n, w in zip(narrow, whole, strict=True):
            assert (n.number, n.state) == (w.number, w.state)
            assert n.value == (w.value if w.state == TrialState.COMPLETE else None)
            assert trial_outcome(n) == trial_outcome(w)
            assert trial_layout(n) == trial_layout(w)
        claimed = {Layout(tp=4, pp=1, dp=1, micro_batch=1, grad_accum=1).key(): 1}
        assert observations(narrow, claimed) == observations(whole, claimed)
        # The run's closing table and best line: the same from the narrow read.
        everything = judged_trials(storage, name, states=None, keys=SUMMARY_KEYS)
        assert trials_table(everything) == trials_table(study.get_trials(deepcopy=False))
        assert [t.state for t in everything].count(TrialState.RUNNING) > 0
        best = read_best_trial(storage, name)
        assert best is not None and best.number == best_trial(study).number
        assert best.user_attrs == best_trial(study).user_attrs  # read whole
    finally:
        storage.close()


def test_sqlite(tmp_path: Path, unique: str) -> None:
    _check(f"sqlite:///{tmp_path / 'judged.db'}", f"judged-{unique}")


@pytest.mark.postgres
def test_postgresql(pg_url: str, unique: str) -> None:
    _check(pg_url, f"judged-{unique}")
