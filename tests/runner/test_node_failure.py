"""A node lost under a trial, without a cluster: the outcome (retried, its state and reason
kept), and the runner (the dead group's worker stops; a sibling at its budget waits for the
retry and measures it). The real thing runs in tests/multinode/test_trials.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.launchers.base import Launcher
from autotune.runner.study import run_study
from autotune.spec import load_study
from autotune.storage import open_storage
from autotune.trial import LaunchReport, TrialPaths, TrialResult, TrialSpec
from autotune.trial.classify import classify
from tests.helpers import write_study


def test_a_node_failure_overrides_the_survivors_error_and_is_retried() -> None:
    survivors = TrialResult(status="error", error="rank 0: Connection closed by peer")
    state = "NODE_FAIL mn4: down* (Not responding) (sacct step state RESIZING)"
    out = classify(LaunchReport(result=survivors, returncode=143, scheduler_state=state))
    assert out.kind == "node_failure" and out.retry and out.node_lost
    assert out.state == TrialState.FAIL and "mn4: down*" in out.reason
    ok = TrialResult(status="ok", model_tflops_per_device=0.5)
    assert classify(LaunchReport(result=ok, returncode=0, scheduler_state=state)).kind \
        == "complete"  # a finished measurement stands
    plain = classify(LaunchReport(result=survivors, returncode=1, scheduler_state="FAILED"))
    assert plain.kind == "error" and not plain.retry


class _Group(Launcher):
    """A node group: ``dies`` makes its first trial end as a lost node would."""

    kind = "slurm"

    def __init__(self, name: str, *, dies: bool, seconds: float) -> None:
        super().__init__()
        self.name, self.dies, self.seconds, self.ran = name, dies, seconds, 0

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        self.ran += 1
        if not self.dies:
            TrialResult(status="ok", model_tflops_per_device=0.001 * self.ran,
                        step_time_s=0.01, world_size=spec.layout.world_size,
                        device="cpu").write(paths.result)
        return time.monotonic() + self.seconds

    def _poll(self, handle: Any) -> int | None:
        return None if time.monotonic() < handle else (143 if self.dies else 0)

    def _kill(self, handle: Any) -> None:
        pass

    def _finish(self, handle: Any) -> tuple[str | None, list[str]]:
        hosts = [f"{self.name}a", f"{self.name}b"]
        return (f"NODE_FAIL {hosts[1]}: down*" if self.dies else "COMPLETED"), hosts


def test_the_dead_groups_worker_stops_and_its_layout_is_retried_elsewhere(
        tmp_path: Path) -> None:
    # The healthy group finishes its trial first and is at the budget (2 claims) while
    # the dying group's trial still runs: it must wait for the retry, not stop.
    path = write_study(tmp_path / "s.yaml", name="lost", devices=1, n_trials=2,
                       search={"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8],
                               "zero_stage": [0], "recompute": ["none"], "n_trials": 2})
    spec = load_study(path)
    storage = open_storage(spec.storage)
    healthy, dying = _Group("h", dies=False, seconds=0.2), _Group("d", dies=True, seconds=1.5)
    summary = run_study(spec, storage, [healthy, dying])
    trials = optuna.load_study(study_name="lost", storage=storage.optuna).get_trials()
    (lost,) = [t for t in trials if t.user_attrs.get("outcome") == "node_failure"]
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert dying.ran == 1 and healthy.ran == 2 and summary.stopped_by == "budget"
    assert len(done) == 2 and len({t.user_attrs["layout"] for t in done}) == 2
    (retry,) = [t for t in done if t.user_attrs.get("retry_of") == lost.number]
    assert retry.user_attrs["layout"] == lost.user_attrs["layout"]
    assert retry.user_attrs["hosts"] == ["ha", "hb"]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
