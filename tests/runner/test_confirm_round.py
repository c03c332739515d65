"""The confirmation round's bounds and ends: its runs are never stopped early, Ctrl-C in it
exits 130 with the best unconfirmed, the device budget and the wall-time limit end it, and
the progress ETA counts it. Replay launcher and SQLite only: seconds."""

from __future__ import annotations

import io
import math
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.cli import main
from autotune.launchers import make_launcher
from autotune.launchers.replay import ReplayLauncher
from autotune.runner import study as study_module
from autotune.runner.confirm import confirm_best
from autotune.runner.progress import Progress
from autotune.storage.confirmations import stored_runs, unfinished_line
from autotune.storage.db import open_storage
from autotune.trial.measurement import StopRule
from tests.runner.test_confirm import _key, _run, _study

DRIFT = [{"layout": "KEY", "factors": [1.06, 1.06, 1.06, 1.0]}]


def _drift(spec_dir: Path) -> list[dict[str, Any]]:
    probe = _study(spec_dir / "probe", confirm=0)
    return [{**DRIFT[0], "layout": _key(probe, mb=1, tp=2)}]


def test_no_confirmation_run_is_stopped_early(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    original = ReplayLauncher.run_batch

    def spy(self: ReplayLauncher, specs: Any, paths: Any, **kw: Any) -> Any:
        if any("confirm-" in str(p.root) for p in paths):
            seen.extend(specs)
        return original(self, specs, paths, **kw)

    monkeypatch.setattr(ReplayLauncher, "run_batch", spy)
    # The search stops hopeless trials early (tolerance 10%); its confirmation must not.
    spec = _study(tmp_path, confirm=3, drift=_drift(tmp_path),
                  trial={"early_stop_tolerance": 0.1})
    assert spec.run_config(1.0).early_stop_tolerance == 0.1
    storage = open_storage(spec.storage)
    summary, _ = _run(spec, storage)
    assert summary.confirmation is not None and summary.confirmation["rounds"] >= 2
    assert seen and all(s.run.early_stop_tolerance is None
                        and s.run.best_model_tflops_per_device is None for s in seen)
    # The trainer's own bar (the best of its launch so far) then sets no limit either.
    rule = StopRule.of(seen[0].run, spec.model, seen[0].layout, 4, best_tflops=1e9)
    assert rule.max_step_time_s is None
    runs = stored_runs(storage, 1)
    assert runs and not [r for r in runs if r["outcome"] == "stopped"]


def test_ctrl_c_in_the_confirmation_round_exits_130_unconfirmed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    original = ReplayLauncher.run_batch
    calls = {"confirm": 0}

    def interrupted(self: ReplayLauncher, specs: Any, paths: Any, **kw: Any) -> Any:
        reports = original(self, specs, paths, **kw)
        if any("confirm-" in str(p.root) for p in paths) and calls["confirm"] == 0:
            calls["confirm"] += 1
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, during the round
            time.sleep(0.05)  # the handler runs in this (the main) thread
        return reports

    monkeypatch.setattr(ReplayLauncher, "run_batch", interrupted)
    spec = _study(tmp_path, confirm=3, drift=_drift(tmp_path))
    assert main(["run", str(spec.source)]) == 130
    out = capsys.readouterr()
    assert "budget of 3 trials reached" not in out.err + out.out
    assert "interrupted in the confirmation round" in out.err
    best = [ln for ln in out.out.splitlines() if ln.startswith("best layout:")]
    assert best and "unconfirmed" in best[0]
    storage = open_storage(spec.storage)
    assert unfinished_line(storage, spec.name) is not None  # released, for the next run
    # The next run goes on (nothing interrupts it now) and decides.
    assert main(["run", str(spec.source)]) == 0
    out = capsys.readouterr()
    assert "paired rounds: distinguishable" in out.err and "unconfirmed" not in out.out


def test_the_device_budget_ends_the_round_and_the_single_pass_best_stands(
        tmp_path: Path) -> None:
    drift = _drift(tmp_path)
    probe = _study(tmp_path / "probe", confirm=0)
    rival = _key(probe, mb=2, tp=2)
    # A tenth of the search's device-seconds: the first step (2 rounds of 2 runs, each
    # about a candidate trial's cost) does not fit, so nothing is measured.
    spec = _study(tmp_path / "tight", confirm=3, drift=drift, budget=0.1)
    storage = open_storage(spec.storage)
    summary, _ = _run(spec, storage)
    record = summary.confirmation
    assert record is not None and record["state"] == "budget"
    assert record["launches"] == 0 and record["device_s"] == 0.0
    assert record["winner"] == rival  # the single pass's best (it measured the best slow)
    assert summary.best is not None and summary.best.user_attrs["layout"] == rival
    from autotune.trial.paired import decision_line

    assert decision_line(record).startswith("not decided within the budget")
    assert stored_runs(storage, 1) == []
    # Left open: the same study run again with a larger budget goes on and decides.
    again = _study(tmp_path / "tight", confirm=3, drift=drift, budget=10.0)
    summary, _ = _run(again, storage)
    assert summary.confirmation is not None and summary.confirmation["state"] == "decided"


def test_the_rounds_the_budget_affords_are_planned_and_decide(tmp_path: Path) -> None:
    # Each run its own launch (the replay launcher): a budget of about 9 runs affords 4
    # rounds of 2 runs. The rounds disagree (the best is slowed in rounds 0 and 2, sped up
    # in 1 and 3), so no look settles it; the 4th round ends the round with a verdict on
    # the 4 rounds paid for, not with "not decided within the budget" after a refused
    # 5th and 6th (which threw them away).
    probe = _study(tmp_path / "probe", confirm=0)
    best = _key(probe, mb=1, tp=2)
    factors = [1.0, 1.0, 1.0, 1.08, 1.0, 1.0, 0.95, 1.08, 1.0, 1.0, 0.95, 1.0]
    spec = _study(tmp_path / "planned", confirm=3, budget=3.0,
                  drift=[{"layout": best, "factors": factors}])
    storage = open_storage(spec.storage)
    out = io.StringIO()
    summary, _ = _run(spec, storage, progress=Progress(total=3, stream=out))
    seen = out.getvalue().splitlines()
    record = summary.confirmation
    assert record is not None and record["state"] == "decided", record
    assert record["rounds"] == 4 and record["launches"] == 8
    assert not record["distinguishable"]
    assert any("4 rounds at most (what the budget affords of search.confirm_max_rounds 12)"
               in line for line in seen), seen
    assert record["device_s"] <= 3.0 * _search_device_s(storage, spec.name) + 1e-6


def _search_device_s(storage: Any, name: str) -> float:
    from autotune.runner.confirm_budget import search_cost

    return search_cost(storage, name).device_s


def test_a_step_starts_only_when_its_estimated_cost_fits_the_budget() -> None:
    from autotune.runner.confirm_budget import Allowance, SearchCost

    search = SearchCost(100.0, {0: 10.0, 1: 30.0, 2: 60.0})
    # In batches the search's mean execution (the first member carries the start-up).
    batched = Allowance.of(0.5, SearchCost(100.0, {0: 70.0, 1: 20.0}, 4), [0, 1],
                           world_size=4, deadline=None, batched=True)
    assert batched.per_run_device_s == 25.0
    # Else the candidates' trials' median (a first launch's one-time costs do not skew it).
    allowance = Allowance.of(0.5, search, [0, 1, 2], world_size=4, deadline=None)
    assert allowance.budget_device_s == 50.0 and allowance.per_run_device_s == 30.0
    assert allowance.refusal(1, 0.0) is None  # 30 of 50
    refused = allowance.refusal(2, 0.0)  # 60 > 50
    assert refused is not None and refused[0] == "budget"
    allowance.observe(24.0, 4)  # the runs so far cost 6 each: the estimate follows them
    assert allowance.refusal(4, 24.0) is None  # 24 + 24 of 50
    assert allowance.refusal(6, 24.0) is not None  # 24 + 36
    late = Allowance.of(None, search, [0], world_size=4, deadline=time.monotonic() + 1.0)
    refused = late.refusal(4, 0.0)  # 4 runs of 10 device-s on 4 devices: 10 s > 1 s left
    assert refused is not None and refused[0] == "timeout"
    assert Allowance.of(None, search, [0], world_size=4,
                        deadline=time.monotonic() + 3600.0).refusal(4, 1e9) is None


def test_the_wall_time_limit_covers_the_round(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _study(tmp_path, confirm=3, drift=_drift(tmp_path))
    storage = open_storage(spec.storage)
    _run(_study(tmp_path, confirm=0, drift=_drift(tmp_path)), storage)
    study = optuna.load_study(study_name=spec.name, storage=storage.optuna)
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training)
    done = confirm_best(spec, storage, study, launcher, worker="w:1",
                        deadline=time.monotonic() - 1.0)
    assert done.ended == "timeout" and done.record is None
    assert "wall-time limit" in done.line and "unconfirmed" in done.line
    assert stored_runs(storage, 1) == []
    # run_study hands the round the run's own deadline (--timeout, search.timeout_s).
    got: dict[str, Any] = {}

    def capture(*args: Any, **kw: Any) -> Any:
        got.update(kw)
        return confirm_best(*args, **kw)

    monkeypatch.setattr(study_module, "confirm_best", capture)
    before = time.monotonic()
    summary, _ = _run(spec, storage, timeout_s=3600.0)
    assert before + 3600.0 <= got["deadline"] <= time.monotonic() + 3600.0
    assert summary.confirmation is not None and summary.confirmation["state"] == "decided"


def test_the_eta_includes_the_confirmation_round() -> None:
    from autotune.layout import Layout
    from autotune.trial.outcome import Outcome, Verdict

    lay = Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=2)
    shown = {}
    for share in (0.0, 0.25):
        out = io.StringIO()
        p = Progress(total=2, stream=out, confirm_share=share)
        p.started -= 100.0  # one trial took 100 s; one is left
        p.trial_started(0, lay, None)
        p.trial_finished(0, lay, Verdict(Outcome.COMPLETE, 1.0), None)
        m = re.search(r"ETA (\d+)m(\d+)s", out.getvalue())
        assert m is not None
        shown[share] = 60 * int(m.group(1)) + int(m.group(2))
    assert 99 <= shown[0.0] <= 130
    # The round may spend a quarter of the search's (about 200 s) on top of the trial left.
    assert shown[0.25] == pytest.approx(shown[0.0] * 1.5, abs=2)


def test_equally_fast_candidates_are_named_equivalent_and_the_cost_is_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import json

    from autotune.report import analysis as an
    from autotune.report.frames import measurements_frame
    from autotune.report.results import format_statuses, study_status
    from autotune.storage.confirmations import confirmation_cost
    from tests.runner import test_confirm

    # Two layouts exactly as fast (a replayed table: every step alike).
    monkeypatch.setattr(test_confirm, "ROWS", [(4, 8, 1, 2, 2, 1, 100.0),
                                               (4, 8, 2, 2, 2, 1, 100.0),
                                               (4, 8, 1, 4, 1, 1, 130.0)])
    spec = _study(tmp_path, confirm=3)
    storage = open_storage(spec.storage)
    summary, study = _run(spec, storage)
    record = summary.confirmation
    assert record is not None and record["state"] == "decided"
    assert record["equivalent"] and not record["distinguishable"]
    single_pass = max((t for t in study.get_trials() if t.value is not None),
                      key=lambda t: (t.value, -t.number))
    assert record["winner"] == single_pass.user_attrs["layout"]  # the single pass's, kept
    other = record["equivalent_to"]
    assert other != record["winner"]
    assert main(["best", str(spec.source), "--emit", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["equivalence"] == f"equivalent to {other} within ±0.0%"
    assert f"equivalent to {other} within ±0.0%" in out.err
    # The report's tuning cost counts the round's runs and device-seconds.
    cost = confirmation_cost(storage, spec.name)
    assert cost.runs == 4 and cost.launches == 4
    assert cost.device_s == pytest.approx(record["device_s"], abs=1e-3)
    meas = measurements_frame(storage.engine, study_name=spec.name)
    table = an.tuning_cost(meas, (cost.runs, cost.wall_s, cost.device_s))
    assert "confirmation round" in set(table["outcome"])
    trials_only = an.tuning_cost(meas)
    assert table["device_hours"].iloc[-1] == pytest.approx(
        trials_only["device_hours"].iloc[-1] + cost.device_s / 3600.0)
    # Stale, the note says what the next run really does with unchanged candidates.
    study.set_user_attr("confirmation", {**record, "complete_trials": 2})
    assert "unchanged, it keeps this verdict and measures nothing" in format_statuses(
        [study_status(study)])


def test_run_takes_confirm_budget_and_no_confirm(tmp_path: Path, capsys: Any) -> None:
    spec = _study(tmp_path, confirm=3, drift=_drift(tmp_path), budget=10.0)
    for bad in ("-0.5", "x", "1000"):
        with pytest.raises(SystemExit) as exc:
            main(["run", str(spec.source), "--confirm-budget", bad])
        assert exc.value.code == 2
        assert "--confirm-budget" in capsys.readouterr().err
    # The command line's 0.1 overrides the study file's 10: the round does not fit.
    assert main(["run", str(spec.source), "--confirm-budget", "0.1"]) == 0
    assert "not decided within the budget" in capsys.readouterr().err
    other = _study(tmp_path / "off", confirm=3, drift=_drift(tmp_path))
    assert main(["run", str(other.source), "--no-confirm"]) == 0
    assert "confirmation round: off" in capsys.readouterr().err


def _repeat_measurements(storage: Any, name: str, spread: float) -> None:
    """Store every measured layout twice more, ``spread`` apart in log throughput: the
    repeats (retries, resumed layouts) the launch-to-launch noise is read from."""
    from sqlalchemy import select
    from sqlalchemy.orm import make_transient

    from autotune.storage.schema import Measurement

    with storage.session() as s:
        rows = list(s.scalars(select(Measurement).where(Measurement.study_name == name,
                                                        Measurement.outcome == "complete")))
        for row in rows:
            for factor in (math.exp(spread), math.exp(-spread)):
                s.expunge(row)
                make_transient(row)
                row.id = None
                value = row.model_tflops_per_device
                row.model_tflops_per_device = value * factor if value else value
                s.add(row)
                s.flush()
                row.model_tflops_per_device = value


def test_the_round_is_skipped_when_the_measured_launch_noise_cannot_flip_the_order(
        tmp_path: Path) -> None:
    from autotune.runner.confirm_budget import launch_noise

    quiet, noisy = (_study(tmp_path / d, confirm=3) for d in ("quiet", "noisy"))
    for spec, spread, skipped in ((quiet, 0.001, True), (noisy, 0.03, False)):
        storage = open_storage(spec.storage)
        _run(_study(tmp_path / ("quiet" if skipped else "noisy"), confirm=0), storage)
        _repeat_measurements(storage, spec.name, spread)
        noise = launch_noise(storage, spec.name)
        assert noise is not None and noise.df >= 2
        study = optuna.load_study(study_name=spec.name, storage=storage.optuna)
        # The candidates are 3% apart; each trial's precision is the replay's own (0).
        launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training)
        done = confirm_best(spec, storage, study, launcher, worker="w:1")
        assert ("launch-to-launch noise" in done.line) is skipped, done.line
        assert done.record is not None
        assert (done.record["state"] == "single") is skipped


def test_the_budget_trims_the_farthest_rivals_first(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.runner import confirm
    from autotune.runner.confirm_budget import SearchCost
    from tests.runner import test_confirm

    monkeypatch.setattr(test_confirm, "ROWS", [(4, 8, 1, 2, 2, 1, 100.0),
                                               (4, 8, 2, 2, 2, 1, 101.0),
                                               (4, 8, 1, 4, 1, 1, 102.0)])
    # Every trial cost 10 device-s of a search of 100: half of it pays 4 runs, not 6.
    monkeypatch.setattr(confirm, "search_cost",
                        lambda *_: SearchCost(100.0, {n: 10.0 for n in range(3)}, 10))
    spec = _study(tmp_path, confirm=3, budget=0.5)
    summary, _ = _run(spec)
    record = summary.confirmation
    assert record is not None and len(record["candidates"]) == 2
    probe = _study(tmp_path / "probe", confirm=0)
    assert _key(probe, mb=1, tp=4) not in record["candidates"]  # the slowest rival went
