"""Adaptive measurement of a user's program (issue #24): autotune follows the steps as they
stream in and stops the program once the median is known to the study's precision, by the
built-in trainer's own rule (:class:`autotune.trial.measurement.StopRule`).

A stand-in program (``programs/timed_steps.py``) reports step times it is given, so each
case is exact: a stop once the precision is reached, none before ``measure_steps`` however
steady the first steps are, noise that runs to the cap, a program whose own step count ends
first, and one that ignores the cap. Started as it is (``outer: none``, no torchrun): each
case takes about a second."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.config.workload import WorkloadConfig
from autotune.launchers.local import LocalLauncher
from autotune.layout import Layout
from autotune.trial import RunConfig, TrialPaths, TrialResult, TrialSpec
from autotune.trial.classify import classify
from autotune.trial.measurement import relative_precision
from autotune.trial.outcome import Verdict
from autotune.trial.report import LaunchReport
from autotune.workloads import adaptive
from autotune.workloads.foreign import CommandWorkload, train_iters
from autotune.workloads.oom_signatures import OOM_SIGNATURES
from tests.helpers import REPO, no_processes_mentioning
from tests.workloads.conftest import PROGRAMS

MODEL = ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=64, vocab_size=256, ffn_hidden=256)
LAYOUT = Layout(tp=1, pp=1, dp=1, micro_batch=2, grad_accum=4)
# A slow first step, then within 2 % for every step the program may print (the list
# repeats: a slow step among them would be measured too, if the program printed it
# before autotune's stop reached it).
STEADY = "9.0," + ",".join(["0.100,0.101,0.099,0.100,0.102,0.098"] * 11)
NOISY = "9.0,0.1,0.3,0.2,0.5"


def _run(tmp_path: Path, times: str, *, steps: str = "{train_iters}", measure_steps: int = 3,
         cap: int = 60, precision: float | None = 0.05, pause: float = 0.1
         ) -> tuple[LaunchReport, dict, TrialPaths]:
    argv = (sys.executable, str(PROGRAMS / "timed_steps.py"), "--steps", steps,
            "--times", times, "--pause", str(pause))
    workload = CommandWorkload(WorkloadConfig(kind="command", outer="none", argv=argv,
                                              env={"PYTHONPATH": str(REPO)},
                                              no_progress_s=60),
                               ClusterConfig(devices_per_node=1, device="cpu"))
    launcher = LocalLauncher()
    launcher.workload = workload
    spec = TrialSpec(model=MODEL, layout=LAYOUT, run=RunConfig(
        device="cpu", warmup_steps=1, measure_steps=measure_steps,
        measure_precision=precision, max_measure_steps=cap if precision else None))
    paths = TrialPaths(tmp_path / "trial")
    report = launcher.run(spec, paths, timeout_s=120)
    assert no_processes_mentioning(str(PROGRAMS / "timed_steps.py")) == []
    return report, json.loads(paths.result.read_text()), paths


def _printed(paths: TrialPaths) -> list[str]:
    return paths.stdout.read_text().splitlines()


def test_stopped_once_the_median_is_known_to_the_precision(tmp_path: Path) -> None:
    report, result, paths = _run(tmp_path, STEADY)
    stop = report.measured_stop
    assert stop is not None and stop["reason"] == "precision"
    # 6 steady steps give the first 95 % interval of the median; these are within 2 %.
    assert 6 <= stop["steps"] < 60 and stop["precision"] <= 0.05
    assert "done" not in _printed(paths)  # stopped, not run to its end (61 steps)
    outcome = classify(report)
    assert outcome.kind == "complete" and "stopped by autotune" in outcome.reason
    assert result["status"] == "ok" and result["error"] is None
    assert result["measurement_stop"]["reason"] == "precision"
    # What was printed is the measurement: warm-up dropped, precision stored.
    assert result["step_times_s"] == pytest.approx(result["all_step_times_s"][1:])
    assert result["all_step_times_s"][0] == 9.0 and len(result["step_times_s"]) >= 6
    assert result["measure_precision"] == pytest.approx(
        relative_precision(result["step_times_s"], 0.95)) and result["measure_precision"] <= 0.05
    assert json.loads(paths.report.read_text())["measured_stop"]["reason"] == "precision"


def test_never_stopped_before_measure_steps_however_steady(tmp_path: Path) -> None:
    report, result, _ = _run(tmp_path, STEADY, measure_steps=10)
    assert report.measured_stop is not None and report.measured_stop["steps"] >= 10
    assert len(result["step_times_s"]) >= 10


def test_noise_runs_to_the_cap_the_program_was_given(tmp_path: Path) -> None:
    report, result, paths = _run(tmp_path, NOISY, cap=8, pause=0.03)
    # Told to end at warm-up + cap, it does so itself: no stop, the steps it printed.
    assert report.measured_stop is None and report.returncode == 0
    assert "done" in _printed(paths)
    assert len(result["step_times_s"]) == 8 and result["measure_precision"] > 0.05
    assert classify(report).kind == "complete"


def test_the_programs_own_step_count_ends_first(tmp_path: Path) -> None:
    report, result, _ = _run(tmp_path, NOISY, steps="5")
    assert report.measured_stop is None and report.returncode == 0
    assert result["status"] == "ok" and len(result["step_times_s"]) == 4
    assert result["measure_precision"] is None  # 4 steps: no 95 % interval yet


def test_a_program_that_ignores_the_cap_is_stopped_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adaptive, "CAP_GRACE_S", 0.5)
    report, result, paths = _run(tmp_path, NOISY, steps="1000", cap=6, pause=0.05)
    assert report.measured_stop is not None and report.measured_stop["reason"] == "cap"
    assert "done" not in _printed(paths) and classify(report).kind == "complete"
    assert len(result["step_times_s"]) >= 6


def test_a_fixed_step_count_without_precision_is_not_watched(tmp_path: Path) -> None:
    spec = TrialSpec(model=MODEL, layout=LAYOUT, run=RunConfig(warmup_steps=2,
                                                               measure_steps=3,
                                                               measure_precision=None))
    assert train_iters(spec) == 5
    report, result, _ = _run(tmp_path, STEADY, precision=None, measure_steps=3)
    assert report.measured_stop is None and len(result["step_times_s"]) == 3


def foreign_outcome(report: LaunchReport) -> Verdict:
    """The verdict of a user's program, decided afresh (the report carries the one its
    workload decided when it wrote the result file)."""
    report.verdict = None
    return classify(report, OOM_SIGNATURES)


def test_a_slurm_stop_is_a_measurement_not_a_cancellation() -> None:
    # scancel of the step makes sacct say CANCELLED; the stop was ours.
    res = TrialResult(status="ok", model_tflops_per_device=0.5, step_times_s=[0.1] * 6)
    stop = {"reason": "precision", "steps": 6, "precision": 0.01, "target_precision": 0.05,
            "cap": 12}
    report = LaunchReport(result=res, returncode=-9, scheduler_state="CANCELLED by 1000",
                          workload="command", measured_stop=stop, readback={"steps": 7})
    assert foreign_outcome(report).kind == "complete"
    report.measured_stop = None
    assert foreign_outcome(report).kind == "interrupted"
    report.measured_stop = {**stop, "reason": "hopeless", "detail": "median >= 0.2 s"}
    hopeless = foreign_outcome(report)
    assert hopeless.kind == "stopped" and hopeless.reason.startswith("median >= 0.2 s")
