"""The study's calibration on the live path (issue #13, part 2): an OOM measured on a layout
predicted to fit moves the verdict and the probability of fitting of its siblings, as the
strategy sees them before the next proposal; the study records what it learned from.

Trials are answered by a scripted launcher (an accelerator's OOM cannot happen on this
CPU machine); the runner, the calibration, the strategy and the database are the real
thing, in about a second."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

import autotune.runner.worker as worker_module
from autotune.feasibility import Constraints
from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.models.memory_uncertainty import FitVerdict
from autotune.runner.learning import plan_calibration
from autotune.runner.study import run_study
from autotune.search import Observation, Strategy
from autotune.spec import StudySpec, parse_study
from autotune.storage import open_storage
from autotune.storage.keys import StudyAttr, TrialAttr
from autotune.storage.study_records import learned_from_line
from autotune.trial import TrialPaths, TrialResult, TrialSpec


class ScriptedLauncher(Launcher):
    """Answers the n-th trial with ``answer(spec, n)`` through the result file."""

    kind = "scripted"

    def __init__(self, answer: Callable[[TrialSpec, int], TrialResult]) -> None:
        super().__init__()
        self.answer = answer
        self.launched: list[Layout] = []

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        self.launched.append(spec.layout)
        self.answer(spec, len(self.launched)).write(paths.result)
        return 0

    def _poll(self, handle: Any) -> int | None:
        return int(handle)

    def _kill(self, handle: Any) -> None:
        return None


def _first_runs_out_of_memory(spec: TrialSpec, n: int) -> TrialResult:
    if n == 1:
        return TrialResult(status="oom", error="CUDA out of memory (scripted)")
    return TrialResult(status="ok", model_tflops_per_device=150.0, step_time_s=1.0,
                       step_times_s=[1.0])


def _spec(tmp_path: Path, **search: Any) -> StudySpec:
    return parse_study({
        "name": "live", "model": {"preset": "gpt-1.3b"},
        "cluster": {"nodes": 1, "devices_per_node": 8, "device": "a100-40gb"},
        "training": {"global_batch": 64},
        "search": {"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8], "zero_stage": [1, 2],
                   "recompute": ["none", "full"], "strategy": "cost-model-only",
                   "n_trials": 2, **search},
        "storage": {"url": f"sqlite:///{tmp_path / 'live.db'}"},
        "launcher": {"kind": "local", "run_dir": str(tmp_path / "runs")}})


def _spy(monkeypatch: pytest.MonkeyPatch,
         ) -> list[tuple[dict[Layout, float], list[Observation]]]:
    """What the strategy is shown at each proposal: every candidate's p_fit, the history."""
    seen: list[tuple[dict[Layout, float], list[Observation]]] = []
    real = worker_module.make_strategy

    def make(name: str, **kwargs: Any) -> Strategy:
        strategy = real(name, **kwargs)
        propose, p_fit = strategy.propose, kwargs["p_fit"]

        def spied(candidates: Any, history: Any) -> Layout | None:
            seen.append(({lay: p_fit(lay) for lay in candidates}, list(history)))
            return propose(candidates, history)

        strategy.propose = spied  # type: ignore[method-assign]
        return strategy

    monkeypatch.setattr(worker_module, "make_strategy", make)
    return seen


def test_an_oom_on_a_layout_predicted_to_fit_moves_its_siblings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path)
    seen = _spy(monkeypatch)
    launcher = ScriptedLauncher(_first_runs_out_of_memory)
    storage = open_storage(spec.storage)
    run_study(spec, storage, launcher)
    first = launcher.launched[0]
    constraints = Constraints.from_configs(spec.cluster, spec.training, spec.search,
                                           spec.trial)
    fresh = constraints.memory_verdict(first, spec.model)
    assert fresh is not None and fresh.verdict is FitVerdict.FITS  # predicted to fit, with room

    (before, _), (after, history) = seen[0], seen[1]
    assert [o.status for o in history] == ["oom"]
    assert all(p > 0.9 for lay, p in before.items() if lay != first and lay.zero_stage == 2
               and lay.recompute == "none" and lay.micro_batch < first.micro_batch)
    # Its lighter siblings: still candidates, no longer sure to fit.
    lighter = [lay for lay in after if lay.micro_batch < first.micro_batch
               and lay.zero_stage == first.zero_stage and lay.recompute == first.recompute]
    assert lighter and all(after[lay] < before[lay] for lay in lighter)
    # The hungrier ones: p_fit 0, or out of the space (the corrected prediction exceeds).
    assert all(after.get(lay, 0.0) == 0.0 for lay in before if lay != first
               and lay.micro_batch >= first.micro_batch and lay.recompute == "none"
               and lay.zero_stage <= first.zero_stage)
    # Layouts it does not dominate moved too: the memory correction is shared (half of it
    # with the other ZeRO stage), and some verdicts went from fits to uncertain.
    other = [lay for lay in after if lay.recompute == "full"]
    assert any(after[lay] < before[lay] - 0.01 for lay in other)
    assert any(before[lay] >= 0.975 and 0.025 <= after.get(lay, 0.0) < 0.975
               for lay in before if lay.zero_stage != first.zero_stage)

    # The second trial ran under the corrected prediction, and the study says so.
    optuna_study = optuna.load_study(study_name=spec.name, storage=spec.storage.url)
    second = optuna_study.get_trials(states=(TrialState.COMPLETE,))[0].user_attrs
    assert second[TrialAttr.CALIBRATED_MEMORY_GIB] > 1.2 * second[TrialAttr.PREDICTED_MEMORY_GIB]
    record = optuna_study.user_attrs[StudyAttr.LEARNED_FROM]
    assert record["memory"]["oom"] == 1 and record["memory"]["factor"] > 1.2
    by_stage = record["memory"]["by_zero_stage"]
    assert by_stage["2"]["factor"] > by_stage["1"]["factor"] > 1.05
    assert record["own"] == 2 and record["studies"] == []
    line = learned_from_line(record)
    assert line is not None and line.startswith("no earlier study of a100-40gb/bf16/builtin")

    # `autotune plan` reads the same: the siblings' verdicts as the runner has them.
    cal, ooms, _fits, note = plan_calibration(spec)
    assert note is None and ooms == [first] and cal is not None
    assert cal.memory_factor == pytest.approx(record["memory"]["factor"], rel=1e-4)
    storage.close()


def test_without_learning_from_the_database_a_second_study_starts_fresh(
        tmp_path: Path) -> None:
    first = _spec(tmp_path)
    storage = open_storage(first.storage)
    run_study(first, storage, ScriptedLauncher(_first_runs_out_of_memory))

    def ok(spec: TrialSpec, n: int) -> TrialResult:
        return TrialResult(status="ok", model_tflops_per_device=150.0, step_time_s=1.0)

    learns = parse_study({**_doc(first), "name": "second"})
    run_study(learns, storage, ScriptedLauncher(ok))
    record = _record(learns)
    assert record["studies"] == [{"study": "live", "measurements": 2}]
    assert record["memory"]["oom"] == 1

    off = parse_study({**_doc(first), "name": "third",
                       "search": {**_doc(first)["search"], "learn_from_database": False}})
    run_study(off, storage, ScriptedLauncher(ok))
    record = _record(off)
    assert record["enabled"] is False and record["studies"] == []
    assert record["memory"]["oom"] == 0
    storage.close()


def _doc(spec: StudySpec) -> dict[str, Any]:
    return {"name": spec.name, "model": {"preset": "gpt-1.3b"},
            "cluster": {"nodes": 1, "devices_per_node": 8, "device": "a100-40gb"},
            "training": {"global_batch": 64},
            "search": {"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8],
                       "zero_stage": [1, 2], "recompute": ["none", "full"],
                       "strategy": "cost-model-only", "n_trials": 2},
            "storage": {"url": spec.storage.url},
            "launcher": {"kind": "local", "run_dir": spec.launcher.run_dir}}


def _record(spec: StudySpec) -> dict[str, Any]:
    study = optuna.load_study(study_name=spec.name, storage=spec.storage.url)
    return study.user_attrs[StudyAttr.LEARNED_FROM]
