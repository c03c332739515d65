"""Independent trials side by side: one worker thread per launcher, sharing the study."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.launchers import Launcher, make_launchers
from autotune.launchers.local import LocalLauncher
from autotune.runner.study import run_study
from autotune.spec import load_study
from autotune.storage import open_storage
from tests.helpers import write_study


def _launchers(path: Path) -> list[Launcher]:
    spec = load_study(path)
    return make_launchers(spec.launcher, spec.model, spec.cluster, spec.training,
                          source=spec.source)


def test_an_allocation_of_twice_the_study_nodes_gives_two_disjoint_launchers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No SLURM needed to decide the split: the allocation is read from the environment.
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-04]")
    path = write_study(tmp_path / "s.yaml", launcher={"kind": "slurm"},
                       cluster={"nodes": 2, "devices_per_node": 2, "device": "cpu"})
    launchers = _launchers(path)
    assert [lz.nodelist for lz in launchers] == [["node01", "node02"], ["node03", "node04"]]
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-03]")
    assert len(_launchers(path)) == 1  # 3 nodes hold one 2-node trial


@pytest.mark.slow
def test_two_launchers_share_the_budget_without_repeats(tmp_path: Path) -> None:
    path = write_study(tmp_path / "s.yaml", name="pair", devices=1, n_trials=4,
                       search={"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8],
                               "zero_stage": [0, 1], "recompute": ["none"], "n_trials": 4})
    spec = load_study(path)
    storage = open_storage(spec.storage)
    summary = run_study(spec, storage, [LocalLauncher(), LocalLauncher()])
    assert summary.measured == 4
    trials = optuna.load_study(study_name="pair", storage=storage.optuna).get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 4
    assert len({t.user_attrs["layout"] for t in complete}) == 4
    assert {t.user_attrs["worker"].rsplit("/", 1)[1] for t in complete} == {"0", "1"}
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
