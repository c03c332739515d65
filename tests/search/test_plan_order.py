"""One plan order: a real study proposes what the benchmark replays.

The runner (:mod:`autotune.runner.study`) and the benchmark (``benchmarks/
search_efficiency.py``) must hand a strategy the same candidates in the same order, and
the same history, or the benchmarked strategy is not the one that ships. Each case runs a
real study (Optuna on SQLite, layout claims, the replay launcher) and the benchmark's replay
of the same landscape group with the same strategy and seed, and compares the proposals.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import optuna
import pytest

from autotune.landscape import LandscapeGroup
from autotune.launchers.replay import ReplayLauncher
from autotune.layout import Layout
from autotune.runner.study import run_study
from autotune.search import make_strategy, plan_order
from autotune.spec import parse_study
from autotune.storage import open_storage
from autotune.storage.keys import SKIPPED
from autotune.storage.records import trial_layout, trial_outcome
from benchmarks._common import candidates_of, replay
from tests.search.conftest import synthetic_group


def _study_proposals(group: LandscapeGroup, strategy: str, seed: int, n_trials: int,
                     db: Path) -> list[Layout]:
    """Every layout the study's strategy proposed, in trial order (told infeasible too)."""
    spec = parse_study({
        "name": "plan-order", "model": {"preset": "tiny"},
        "cluster": {"nodes": 1, "devices_per_node": group.cluster.devices_per_node,
                    "device": group.cluster.device},
        "training": {"global_batch": group.global_batch, "dtype": group.dtype},
        "search": {"strategy": strategy, "seed": seed, "n_trials": n_trials},
        "storage": {"url": f"sqlite:///{db}"},
        "launcher": {"kind": "local", "run_dir": str(db.parent / "runs")}})
    storage = open_storage(spec.storage)
    try:
        summary = run_study(spec, storage, ReplayLauncher(group))
        assert summary.stopped_by == "budget" and summary.measured == n_trials
        trials = optuna.load_study(study_name=spec.name, storage=storage.optuna).trials
    finally:
        storage.close()
    layouts = [trial_layout(t) for t in sorted(trials, key=lambda t: t.number)
               if trial_outcome(t) not in (None, SKIPPED)]
    return [lay for lay in layouts if lay is not None]


@pytest.mark.parametrize("oom_mb", [None, 2], ids=["all-ok", "with-ooms"])
@pytest.mark.parametrize("strategy, seed", [("grid", 0), ("random", 7)])
def test_a_study_proposes_what_the_benchmark_replays(tmp_path: Path, strategy: str, seed: int,
                                                     oom_mb: int | None) -> None:
    group = synthetic_group(oom_mb=oom_mb)
    proposed = _study_proposals(group, strategy, seed, 12, tmp_path / "s.db")
    replayed = [obs.layout for obs in itertools.islice(
        replay(make_strategy(strategy, seed=seed), group), len(proposed))]
    assert [lay.key() for lay in proposed] == [lay.key() for lay in replayed]
    if strategy == "grid":
        # Plan order, not the cost model's: grid is the enumeration baseline.
        assert proposed == plan_order(group.layouts())[:len(proposed)]
    if oom_mb is not None and strategy == "grid":
        # The layout that needs more memory than a measured OOM is refused once (not
        # launched, not counted) and then never proposed again.
        assert len(proposed) == 13 and len(set(proposed)) == 13


def test_the_benchmark_replays_candidates_in_plan_order() -> None:
    group = synthetic_group()
    assert candidates_of(group) == plan_order(group.layouts())
