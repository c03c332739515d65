"""Eight workers on one study never store a layout outside its space (issue #17).

Before, a worker whose enqueued trial another worker had taken got a trial sampled by the
study's ``RandomSampler`` over the integer ranges: a layout outside the study's axes,
claimed and measured. Trials are now created for the strategy's layout only, and a lost
claim race stores nothing: with 8 workers and several seeds every stored trial is a row of
the replayed table (the study's space), measured once, and the study holds the budget's
trials and nothing else.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import autotune.launchers.replay  # noqa: F401 (imported once here, not in each forked worker)
from autotune.cli import main
from autotune.launchers import make_launchers
from autotune.spec import load_study
from tests.replay_study import write_replay_study

pytestmark = pytest.mark.slow

WORKERS = 8
N_TRIALS = 30


def _worker(study: str) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")
    os._exit(main(["run", study, "--quiet"]))


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_eight_workers_store_only_layouts_of_the_space(tmp_path: Path, seed: int) -> None:
    study = write_replay_study(tmp_path, name="space", url=f"sqlite:///{tmp_path / 's.db'}",
                               n_trials=N_TRIALS, seed=seed, strategy="random",
                               # Nobody is killed here: a lease that outlives a loaded
                               # machine's pauses (3 s did not, in CI) keeps every trial
                               # its worker's.
                               grace_s=60)
    spec = load_study(study)
    space = {lay.key() for lay in make_launchers(
        spec.launcher, spec.model, spec.cluster, spec.training, source=spec.source,
        workload=spec.workload)[0].fixed_layouts() or ()}
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=_worker, args=(str(study),)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    trials = optuna.load_study(study_name="space", storage=spec.storage.url).get_trials()
    keys = [t.user_attrs["layout"] for t in trials]
    assert set(keys) <= space, sorted(set(keys) - space)
    assert len(trials) == N_TRIALS  # no lost race, no skipped proposal stored as a trial
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len(set(keys)) == N_TRIALS
    assert len({t.user_attrs["worker"] for t in trials}) >= 2  # the work was shared
