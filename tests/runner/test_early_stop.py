"""The runner with an early-stopping strategy: it ends cleanly, says why, stores the reason
in the study, and a resumed run reaches the same decision. Trials are replayed from a
synthetic landscape (the replay launcher), so the whole runner runs in about a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotune import cli
from autotune.launchers.replay import ReplayLauncher
from autotune.runner.study import run_study
from autotune.search._residual import SEED_TRIALS
from autotune.spec import StudySpec, parse_study
from autotune.storage import open_storage
from autotune.storage.keys import StudyAttr
from tests.search.conftest import synthetic_group

# 50% is above any expected improvement once the seeds are measured: the stop is certain
# and its moment (right after the seeds) does not depend on the cost model's figures.
CERTAIN = 0.5


def _doc(tmp_path: Path, min_improvement: float | None, n_trials: int = 10) -> dict[str, Any]:
    """A study file over exactly the synthetic group's layouts (8 devices, batch 16)."""
    return {
        "name": "early", "model": {"preset": "tiny"},
        "cluster": {"nodes": 1, "devices_per_node": 8, "device": "cpu"},
        "training": {"global_batch": 16, "dtype": "fp32"},
        "search": {"tp": [1, 2, 4], "pp": [1, 2], "micro_batch": [1, 2, 4, 8],
                   "zero_stage": [0], "recompute": ["none", "full"], "n_trials": n_trials,
                   "min_improvement": min_improvement},
        "storage": {"url": f"sqlite:///{tmp_path / 'early.db'}"},
        "launcher": {"kind": "local", "run_dir": str(tmp_path / "runs")}}


def _spec(tmp_path: Path, min_improvement: float | None, n_trials: int = 10) -> StudySpec:
    return parse_study(_doc(tmp_path, min_improvement, n_trials))


def _study(spec: StudySpec) -> optuna.Study:
    return optuna.load_study(study_name=spec.name, storage=spec.storage.url)


def _complete(spec: StudySpec) -> list[optuna.trial.FrozenTrial]:
    return _study(spec).get_trials(states=(TrialState.COMPLETE,))


def test_the_run_ends_early_records_why_and_a_resume_decides_the_same(tmp_path: Path) -> None:
    spec = _spec(tmp_path, CERTAIN)
    storage = open_storage(spec.storage)
    summary = run_study(spec, storage, ReplayLauncher(synthetic_group()))
    assert summary.stopped_by == "strategy" and summary.measured == SEED_TRIALS
    assert summary.stop_reason is not None
    assert summary.stop_reason.startswith("expected improvement ")
    assert f"< 50% after {SEED_TRIALS} trials" in summary.stop_reason
    record: dict[str, Any] = _study(spec).user_attrs[StudyAttr.SEARCH_STOP]
    assert record["reason"] == summary.stop_reason and record["judged"] == SEED_TRIALS
    assert record["min_improvement"] == CERTAIN and record["strategy"] == "default"
    trials = _study(spec).get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]

    # A fresh runner (a fresh strategy, the full history) stops at once, for the same reason.
    again = run_study(spec, storage, ReplayLauncher(synthetic_group()))
    assert (again.stopped_by, again.measured, again.stop_reason) == (
        "strategy", 0, summary.stop_reason)
    assert len(_complete(spec)) == SEED_TRIALS

    # Without the option the same study goes on to its budget, and the record is cleared.
    off = run_study(_spec(tmp_path, None, n_trials=SEED_TRIALS + 2), storage,
                    ReplayLauncher(synthetic_group()))
    assert off.stopped_by == "budget" and off.measured == 2 and off.stop_reason is None
    assert _study(spec).user_attrs[StudyAttr.SEARCH_STOP] is None
    assert len({t.user_attrs["layout"] for t in _complete(spec)}) == SEED_TRIALS + 2


def test_status_and_the_final_summary_show_the_reason(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    path = tmp_path / "early.yaml"
    path.write_text(yaml.safe_dump(_doc(tmp_path, CERTAIN)))
    # `autotune run` itself, with its launchers replaced by the replay of the table.
    monkeypatch.setattr("autotune.launchers.make_launchers",
                        lambda *_configs, **_source: [ReplayLauncher(synthetic_group())])
    assert cli.main(["run", str(path)]) == cli.EXIT_OK
    out = capsys.readouterr()
    assert "[autotune] search stopped: expected improvement" in out.err
    assert "best layout:" in out.out

    assert cli.main(["status", str(path)]) == cli.EXIT_OK
    status = capsys.readouterr().out
    assert "early: search stopped: expected improvement" in status
    assert "(search.min_improvement 0.5)" in status


def test_side_by_side_workers_each_stop(tmp_path: Path) -> None:
    spec = _spec(tmp_path, CERTAIN)
    storage = open_storage(spec.storage)
    group = synthetic_group()
    summary = run_study(spec, storage, [ReplayLauncher(group), ReplayLauncher(group)])
    assert summary.stopped_by == "strategy" and summary.stop_reason
    # A worker may finish one seed the other already counted as pending: at most one extra.
    assert SEED_TRIALS <= summary.measured <= SEED_TRIALS + 1
    trials = _study(spec).get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert _study(spec).user_attrs[StudyAttr.SEARCH_STOP]["reason"]
