"""The one rule that says a study is done, and that its readers agree with the runner."""

from __future__ import annotations

from pathlib import Path

from autotune.campaign import jobs
from autotune.launchers.replay import ReplayLauncher
from autotune.runner.budget import budget_reached, search_stop_holds, study_done, within_budget
from autotune.runner.study import run_study
from autotune.spec import parse_study
from autotune.storage import open_storage
from tests.search.conftest import synthetic_group

STOP = {"reason": "expected improvement 0.2% < 1%", "min_improvement": 0.01}


def _done(claimed: int = 0, running: int = 0, waiting: int = 0,
          search_stop: dict | None = None, n_trials: int = 10,
          min_improvement: float | None = None) -> bool:
    return study_done(claimed=claimed, running=running, waiting=waiting,
                      search_stop=search_stop, n_trials=n_trials,
                      min_improvement=min_improvement)


def test_the_budget_counts_claims_and_a_waiting_retry_is_within_it() -> None:
    assert budget_reached(3, 3) and not budget_reached(2, 3)
    assert within_budget(3, 3) and not within_budget(4, 3)
    assert _done(claimed=10) and _done(claimed=11)
    assert not _done(claimed=9)
    assert not _done(claimed=10, waiting=1)  # an interrupted layout waits to be re-run
    assert _done(claimed=10, running=2)  # running trials are claims within the budget


def test_a_recorded_stop_holds_at_its_threshold_or_a_looser_one() -> None:
    assert search_stop_holds(STOP, 0.01) and search_stop_holds(STOP, 0.05)
    assert not search_stop_holds(STOP, 0.005)  # a stricter threshold may go on
    assert not search_stop_holds(STOP, None)  # the option is off: spend the budget
    assert not search_stop_holds(None, 0.01)
    assert not search_stop_holds({"reason": "old record"}, 0.01)  # threshold unknown
    assert _done(claimed=4, search_stop=STOP, min_improvement=0.01)
    assert not _done(claimed=4, running=1, search_stop=STOP, min_improvement=0.01)
    assert not _done(claimed=4, waiting=1, search_stop=STOP, min_improvement=0.01)


def test_the_campaign_reads_a_finished_study_as_done(tmp_path: Path) -> None:
    group = synthetic_group()
    db = tmp_path / "s.db"
    spec = parse_study({
        "name": "budget", "model": {"preset": "tiny"},
        "cluster": {"nodes": 1, "devices_per_node": 8, "device": group.cluster.device},
        "training": {"global_batch": group.global_batch, "dtype": group.dtype},
        "search": {"strategy": "grid", "n_trials": 3},
        "storage": {"url": f"sqlite:///{db}"},
        "launcher": {"kind": "local", "run_dir": str(tmp_path / "runs")}})
    storage = open_storage(spec.storage)
    try:
        assert run_study(spec, storage, ReplayLauncher(group)).stopped_by == "budget"
    finally:
        storage.close()
    progress = jobs.study_progress(spec.storage.url, spec.name)
    assert (progress.claimed, progress.complete, progress.running, progress.waiting) == \
        (3, 3, 0, 0)
    assert progress.best_value is not None and set(progress.best_params) >= {"tp", "pp"}
    assert jobs.budget_met(spec.storage.url, spec.name, 3)
    assert not jobs.budget_met(spec.storage.url, spec.name, 4)
