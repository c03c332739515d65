"""The built-in trainer's confirmation round in one launch: every candidate's engine in the
same processes, ABBA rounds, never stopped early, the verdict taken round by round; the
trainer's stop file; the schedule and the plan. The real trainer on 2 CPU ranks (tiny
model): tens of seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.launchers import make_launcher
from autotune.layout import Layout
from autotune.runner import confirm as confirm_module
from autotune.runner.confirm import confirm_best
from autotune.runner.confirm_budget import Allowance, SearchCost
from autotune.runner.confirm_rotation import abba_orders, plan_of
from autotune.spec import StudySpec, load_study
from autotune.storage.confirmations import stored_runs
from autotune.storage.db import open_storage
from autotune.storage.keys import TrialAttr
from autotune.trial import TrialSpec
from tests.helpers import write_study

REPO = Path(__file__).resolve().parents[2]

LAYOUTS = [Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=2, zero_stage=z) for z in (0, 1)]


def _spec(tmp_path: Path, **search: Any) -> StudySpec:
    path = write_study(tmp_path / "study.yaml", name="rot", devices=2, n_trials=2,
                       search={"tp": [1], "pp": [1], "micro_batch": [2], "zero_stage": [0, 1],
                               "recompute": ["none"], "n_trials": 2, "confirm": 2,
                               "confirm_budget": 50.0, "confirm_max_rounds": 4, **search})
    return load_study(path)


def _study_with_two_close_trials(spec: StudySpec) -> optuna.Study:
    """Two complete trials whose intervals overlap: the round must measure them."""
    study = optuna.create_study(study_name=spec.name, storage=spec.storage.url,
                                direction="maximize")
    for layout, value in zip(LAYOUTS, (1.00, 0.99), strict=True):
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            TrialAttr.LAYOUT: layout.key(), TrialAttr.LAYOUT_DICT: layout.to_dict(),
            TrialAttr.OUTCOME: "complete", TrialAttr.MEASURE_PRECISION: 0.05}))
    return study


def test_abba_orders_alternate_from_any_round() -> None:
    assert abba_orders(2, 0, 4) == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert abba_orders(3, 2, 2) == [[0, 1, 2], [2, 1, 0]]
    assert abba_orders(2, 0, 0) == []


def test_the_plan_charges_one_start_up_and_per_step_rounds() -> None:
    budget = Allowance(budget_device_s=30.0, deadline=None, world_size=4, per_run_device_s=0)
    plan = plan_of(round_s=0.5, start_up_s=5.0, allowance=budget, spent_device_s=0.0,
                   rounds_left=12, steps_per_slot=3)
    # 20 device-s of start-up, 2 per round: 5 rounds fit, rounded down to an even 4.
    assert (plan.rounds, plan.start_up_device_s, plan.round_device_s) == (4, 20.0, 2.0)
    assert plan.refusal is None
    capped = plan_of(round_s=0.5, start_up_s=5.0, allowance=budget, spent_device_s=0.0,
                     rounds_left=2, steps_per_slot=3)
    assert capped.rounds == 2
    short = plan_of(round_s=0.5, start_up_s=5.0, allowance=budget, spent_device_s=9.0,
                    rounds_left=12, steps_per_slot=3)
    assert short.rounds == 0 and short.refusal is not None and short.refusal[0] == "budget"
    assert "start-up" in short.refusal[1]


def test_the_trainer_stops_before_a_round_when_asked(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    paths = []
    alone = Layout(tp=1, pp=1, dp=1, micro_batch=4, grad_accum=2)  # one rank, no torchrun
    for layout in (alone, alone):
        path = tmp_path / f"{len(paths)}.json"
        path.write_text(json.dumps(TrialSpec(model=spec.model, layout=layout,
                                             run=spec.run_config(None)).to_dict()))
        paths.append(str(path))
    stop, result = tmp_path / "stop", tmp_path / "result.json"
    stop.write_text("{}")
    schedule = tmp_path / "rotation.json"
    schedule.write_text(json.dumps({"specs": paths[:1], "keys": [alone.key()],
                                    "rounds": [[0], [0]], "steps_per_slot": 1,
                                    "result": str(result), "stop": str(stop)}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "trainer", "--rotation", str(schedule)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(result.read_text())
    assert (data["kind"], data["status"], data["ended"], data["rounds"]) == (
        "rotation", "ok", "stopped", [])
    schedule.write_text(json.dumps({"specs": paths, "keys": [], "rounds": [[0, 0]],
                                    "steps_per_slot": 1, "result": str(result)}))
    bad = subprocess.run([sys.executable, "-m", "trainer", "--rotation", str(schedule)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert bad.returncode == 2 and "rounds[0]" in bad.stderr


def test_one_launch_measures_abba_rounds_to_a_verdict(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path)
    storage = open_storage(spec.storage)
    study = _study_with_two_close_trials(spec)
    # What the search would have spent (no search ran here): enough for the cap's rounds.
    monkeypatch.setattr(confirm_module, "search_cost",
                        lambda *_: SearchCost(10.0, {0: 1.0, 1: 1.0}, 10))
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                             workload=spec.workload)
    seen: list[str] = []
    result = confirm_best(spec, storage, study, launcher, worker="w", say=seen.append)
    record = result.record
    assert record is not None, result.line
    assert record["state"] == "decided" and record["rounds"] >= 2, result.line
    assert record["launches"] == 1 and record["device_s"] > 0
    runs = stored_runs(storage, 1)
    rounds = sorted({r["round"] for r in runs})
    assert rounds == list(range(len(rounds))) and 2 <= len(rounds) <= 4
    keys = [layout.key() for layout in LAYOUTS]
    for n in rounds:
        order = [r["layout_key"] for r in runs if r["round"] == n]
        assert order == (keys if n % 2 == 0 else keys[::-1])
    assert all(r["outcome"] == "complete" and r["model_tflops_per_device"] > 0 for r in runs)
    launches = list((Path(spec.launcher.run_dir) / spec.name / "confirm-001").iterdir())
    assert [p.name for p in launches] == ["rotation-00"]
    assert any("side by side" in line for line in seen)


def test_the_watch_hands_each_round_on_once_and_asks_to_stop(tmp_path: Path) -> None:
    from autotune.runner.rotation_launch import RoundWatch as _RoundWatch

    result, stop = tmp_path / "result.json", tmp_path / "stop"
    seen: list[int] = []
    watch = _RoundWatch(result, stop, lambda data, _s: seen.append(data["round"]) or
                        data["round"] == 1)
    watch.poll()  # nothing written yet
    result.write_text(json.dumps({"rounds": [{"round": 0}]}))
    assert not watch.stalled() and seen == [0] and not stop.exists()
    result.write_text(json.dumps({"rounds": [{"round": 0}, {"round": 1}]}))
    watch.poll()
    watch.poll()
    assert seen == [0, 1] and stop.exists()


def test_ctrl_c_in_the_rotation_keeps_its_rounds_and_the_next_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.runner import confirm_rotation

    spec = _spec(tmp_path, confirm_max_rounds=12)
    storage = open_storage(spec.storage)
    study = _study_with_two_close_trials(spec)
    monkeypatch.setattr(confirm_module, "search_cost",
                        lambda *_: SearchCost(10.0, {0: 1.0, 1: 1.0}, 10))
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                             workload=spec.workload)
    original = confirm_rotation.round_runs

    def then_ctrl_c(*args: Any, **kw: Any) -> list[dict[str, Any]]:
        launcher.cancel()  # what the runner's SIGINT handler does, at the first round read
        return original(*args, **kw)

    monkeypatch.setattr(confirm_rotation, "round_runs", then_ctrl_c)
    result = confirm_best(spec, storage, study, launcher, worker="w")
    assert result.ended == "interrupt" and result.record is None
    assert "unconfirmed" in result.line
    # The round read before the interrupt is kept; none read after it.
    kept = sorted({r["round"] for r in stored_runs(storage, 1)})
    assert kept == [0]
    monkeypatch.setattr(confirm_rotation, "round_runs", original)
    again = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                          workload=spec.workload)
    seen: list[str] = []
    resumed = confirm_best(spec, storage, study, again, worker="w", say=seen.append)
    assert resumed.record is not None and resumed.record["state"] == "decided"
    assert any(f"resumed after {len(kept)} stored round" in line for line in seen)
    runs = stored_runs(storage, 1)
    keys = [layout.key() for layout in LAYOUTS]
    rounds = sorted({r["round"] for r in runs})
    assert rounds == list(range(len(rounds)))
    for n in rounds:  # the second launch goes on in the ABBA order where the first stopped
        assert [r["layout_key"] for r in runs if r["round"] == n] == (
            keys if n % 2 == 0 else keys[::-1])
    assert resumed.record["launches"] == (2 if len(rounds) > len(kept) else 1)


def test_a_resumed_plan_ends_on_a_pair_of_rounds() -> None:
    free = Allowance(budget_device_s=None, deadline=None, world_size=2, per_run_device_s=0)
    odd = plan_of(round_s=0.1, start_up_s=1.0, allowance=free, spent_device_s=0.0,
                  rounds_left=11, steps_per_slot=2, first_round=1)
    assert odd.rounds == 11  # rounds 1..11: twelve in all
    last = plan_of(round_s=0.1, start_up_s=1.0, allowance=free, spent_device_s=0.0,
                   rounds_left=1, steps_per_slot=2, first_round=11)
    assert last.rounds == 1
    none = plan_of(round_s=0.1, start_up_s=1.0, allowance=free, spent_device_s=0.0,
                   rounds_left=0, steps_per_slot=2, first_round=12)
    assert none.rounds == 0 and none.refusal is None


def test_rounds_read_after_the_settling_pair_are_not_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow poll can read several rounds at once; the rule stops at the pair that settled
    the verdict, so the rounds the trainer wrote before it saw the stop file are dropped
    (one more, odd, round could unsettle the verdict and cost another launch: CI, loaded)."""
    from autotune.runner import confirm_rotation
    from autotune.storage.confirmations import ConfirmClaimed, claim_confirmation
    from autotune.trial import LaunchReport

    spec = _spec(tmp_path, confirm_max_rounds=12)
    storage = open_storage(spec.storage)
    _study_with_two_close_trials(spec)
    claimed = claim_confirmation(storage, study_name=spec.name, basis="b", worker="w")
    assert isinstance(claimed, ConfirmClaimed)
    keys = [layout.key() for layout in LAYOUTS]

    def four_rounds_in_one_poll(launcher: Any, specs: Any, keys_: list[str], orders: Any, *,
                                on_round: Any, **_: Any) -> confirm_rotation.RotationOutcome:
        asked = [on_round({"slots": [{"slot": i, "layout_key": k, "step_time_s": 0.1,
                                      "model_tflops_per_device": 1.0 + i / 100}
                                     for i, k in enumerate(keys_)]}, 0.5) for _ in range(4)]
        assert asked == [False, True, True, True]
        return confirm_rotation.RotationOutcome(LaunchReport(None, 0, elapsed_s=3.0),
                                                {"rounds": []}, 0.1)

    monkeypatch.setattr(confirm_rotation, "run_rotation", four_rounds_in_one_poll)
    allowance = Allowance(budget_device_s=None, deadline=None, world_size=2,
                          per_run_device_s=1.0)
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                             workload=spec.workload)
    step = confirm_rotation.rotate_rounds(
        spec, storage, launcher, claimed.id, {k: n for n, k in enumerate(keys)}, keys,
        first_round=0, rounds_left=12, allowance=allowance, spent_device_s=0.0, worker="w",
        settles=lambda runs: len({r["round"] for r in runs}) >= 2)
    assert sorted({r["round"] for r in step.runs}) == [0, 1]
    assert sorted({r["round"] for r in stored_runs(storage, claimed.id)}) == [0, 1]
    assert step.launches == 1


def test_a_rotation_slot_stores_its_own_precision_where_its_steps_give_one() -> None:
    from autotune.runner.confirm_rotation import round_runs
    from autotune.trial.measurement import relative_precision

    seven = [0.100, 0.101, 0.099, 0.100, 0.102, 0.098, 0.100]
    data = {"slots": [
        {"slot": 0, "layout_key": "a", "model_tflops_per_device": 1.0, "step_time_s": 0.1,
         "step_times_s": seven},
        {"slot": 1, "layout_key": "b", "model_tflops_per_device": 1.0, "step_time_s": 0.1,
         "step_times_s": seven[:3]},
        {"slot": 2, "layout_key": "c", "model_tflops_per_device": None,
         "step_times_s": seven}]}
    runs = round_runs(data, number=0, world_size=2, by_trial={"a": 0, "b": 1, "c": 2},
                      launcher="local", worker="w", run_dir="x", confidence=0.95)
    assert runs[0]["measure_precision"] == pytest.approx(relative_precision(seven, 0.95))
    assert 0 < runs[0]["measure_precision"] < 0.05
    assert runs[1]["measure_precision"] is None  # 3 steps: no 95 % interval of a median
    assert runs[2]["outcome"] == "error" and runs[2]["measure_precision"] is None


def test_engines_that_do_not_fit_together_fall_back_to_one_launch_per_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotation's second engine runs out of memory (``test_hook: oom_coexist``, what a
    device too small for every candidate at once raises): the round says so in one line
    and measures the candidates one run per launch instead, to a verdict."""
    spec = _spec(tmp_path, confirm_max_rounds=2)
    storage = open_storage(spec.storage)
    study = _study_with_two_close_trials(spec)
    monkeypatch.setattr(confirm_module, "search_cost",
                        lambda *_: SearchCost(10.0, {0: 1.0, 1: 1.0}, 10))
    plain = StudySpec.run_config

    def with_hook(self: StudySpec, best: float | None = None) -> Any:
        from dataclasses import replace
        return replace(plain(self, best), test_hook="oom_coexist")

    monkeypatch.setattr(StudySpec, "run_config", with_hook)
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                             workload=spec.workload)
    seen: list[str] = []
    result = confirm_best(spec, storage, study, launcher, worker="w", say=seen.append)
    assert any("do not fit in memory together" in line for line in seen), seen
    record = result.record
    assert record is not None and record["state"] in ("decided", "budget"), result.line
    runs = stored_runs(storage, 1)
    assert sorted({r["round"] for r in runs}) == [0, 1]
    assert all(r["outcome"] == "complete" for r in runs)
    rotation = json.loads((Path(spec.launcher.run_dir) / spec.name / "confirm-001"
                           / "rotation-00" / "result.json").read_text())
    assert rotation["status"] == "oom" and rotation["coexist"] is False
    assert rotation["built"] == 1 and "oom_coexist" in rotation["error"]
    # The rotation's launch and the fallback's are both counted.
    assert record["launches"] >= 2
