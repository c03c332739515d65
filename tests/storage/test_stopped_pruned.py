"""Trials stopped early are stored as Optuna PRUNED with their measurement as value and
their per-step TFLOPS as intermediate values (autotune/storage/values.py), and every reader
sees them as measured, never as the best; a study stored before, whose stopped trials are
COMPLETE, reads the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.report.frames import trials_frame
from autotune.report.results import selected_trial
from autotune.runner.optuna_io import observations
from autotune.runner.study import run_study
from autotune.spec import StudySpec, parse_study
from autotune.storage import open_storage
from autotune.storage.judged import best_judged, judged_trials
from autotune.storage.values import complete_only, measured_value, step_tflops
from autotune.trial import TrialPaths, TrialResult, TrialSpec

STEPS = [0.20, 0.25, 0.30, 0.22]
"""A stopped trial's timed steps (s); its median, 0.235 s, is its ``step_time_s``."""


class _Stopping(Launcher):
    """Writes a result at once: micro-batch 1 layouts stopped early as hopeless."""

    kind = "stopping"

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        lay = spec.layout
        stopped = lay.micro_batch == 1
        value = 0.1 if stopped else 1.0 + lay.tp + lay.micro_batch / 10
        TrialResult(status="ok", model_tflops_per_device=value,
                    step_time_s=0.235 if stopped else 0.1,
                    step_times_s=list(STEPS) if stopped else [0.1, 0.1, 0.1],
                    early_stopped=stopped, early_stop_reason="hopeless: test" if stopped
                    else None, world_size=lay.world_size, device="cpu").write(paths.result)
        return None

    def _poll(self, handle: Any) -> int | None:
        return 0

    def _kill(self, handle: Any) -> None:
        pass


def _spec(tmp_path: Path) -> StudySpec:
    return parse_study({
        "name": "stopped", "model": {"preset": "tiny"},
        "cluster": {"nodes": 1, "devices_per_node": 2, "device": "cpu"},
        "training": {"global_batch": 4, "dtype": "fp32"},
        "search": {"tp": [1, 2], "pp": [1], "micro_batch": [1, 2], "zero_stage": [0],
                   "recompute": ["none"], "n_trials": 4},
        "storage": {"url": f"sqlite:///{tmp_path / 'stopped.db'}"},
        "launcher": {"kind": "local", "run_dir": str(tmp_path / "runs")}})


def test_a_stopped_trial_is_pruned_with_its_measurement_and_steps(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    storage = open_storage(spec.storage)
    try:
        summary = run_study(spec, storage, _Stopping())
        assert summary.measured == 4
        study = optuna.load_study(study_name=spec.name, storage=storage.optuna)
        trials = study.get_trials()
        stopped = [t for t in trials if t.user_attrs["outcome"] == "stopped"]
        complete = [t for t in trials if t.user_attrs["outcome"] == "complete"]
        assert len(stopped) == 2 and len(complete) == 2
        for t in stopped:
            assert t.state == TrialState.PRUNED and t.value == pytest.approx(0.1)
            # step i ran at value * median / t_i: the slowest step is the lowest.
            assert t.intermediate_values == pytest.approx(
                {i: 0.1 * 0.235 / s for i, s in enumerate(STEPS)})
            assert measured_value(t) == pytest.approx(0.1)
        assert all(t.state == TrialState.COMPLETE and not t.intermediate_values
                   for t in complete)
        # The narrow read, the strategy's history, the report frame: stopped = measured.
        narrow = judged_trials(storage, spec.name)
        assert sorted(measured_value(t) or 0 for t in narrow) == sorted(
            measured_value(t) or 0 for t in trials)
        seen = observations(narrow, {})
        assert {o.status for o in seen} == {"ok"}
        assert sorted(o.value or 0 for o in seen) == pytest.approx(
            sorted(t.value or 0 for t in trials))
        frame = trials_frame(study)
        assert frame["value"].notna().sum() == 4
        # Never the best.
        best = best_judged(storage, spec.name)
        assert best is not None and best.number in {t.number for t in complete}
        chosen = selected_trial(study)
        assert chosen is not None and chosen.user_attrs["outcome"] == "complete"
    finally:
        storage.close()


def test_an_old_study_with_complete_stopped_trials_reads_the_same() -> None:
    study = optuna.create_study(direction="maximize")
    lay = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=2)
    for outcome, value in (("stopped", 9.0), ("complete", 2.0)):
        trial = study.ask()
        trial.set_user_attr("layout", lay.key())
        trial.set_user_attr("layout_dict", lay.to_dict())
        trial.set_user_attr("outcome", outcome)
        study.tell(trial, value)
    trials = study.get_trials()
    assert [measured_value(t) for t in trials] == [9.0, 2.0]
    assert [t.number for t in complete_only(trials)] == [1]
    best = selected_trial(study)
    assert best is not None and best.number == 1
    assert [o.value for o in observations(trials, {})] == [9.0, 2.0]


def test_step_tflops_needs_steps_and_a_median() -> None:
    assert step_tflops(None) == {}
    assert step_tflops(TrialResult(status="ok", model_tflops_per_device=1.0)) == {}
    assert step_tflops(TrialResult(status="ok", model_tflops_per_device=1.0, step_time_s=0.2,
                                   step_times_s=[0.1, 0.4])) == {0: 2.0, 1: 0.5}
