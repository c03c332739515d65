"""A lost lease stops its launch: a trial whose claim is taken over while it runs (repaired
by another runner, as after an outage longer than the grace period) is cancelled at the
next heartbeat, says so in one line, records nothing over its new holder, and the layout
is measured by whoever holds it now (here: this worker's retry)."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import select, update

from autotune.launchers.base import Launcher
from autotune.runner.progress import Progress
from autotune.runner.study import run_study
from autotune.spec import StudySpec, parse_study
from autotune.storage import _optuna_rdb as rdb
from autotune.storage import open_storage
from autotune.storage.db import Storage
from autotune.storage.leases import Lease
from autotune.storage.schema import LayoutClaim
from autotune.trial import TrialPaths, TrialResult, TrialSpec


def _take_over(storage: Storage) -> int:
    """What another runner's repair does, at once: the RUNNING trial is failed and its
    claim's lease cleared for a retry (one transaction, so no beat falls in between).
    Returns the trial's id (its claim's key)."""
    from optuna.storages._rdb import models

    with storage.session() as s:
        [trial_id] = s.scalars(select(models.TrialModel.trial_id).where(
            models.TrialModel.state == TrialState.RUNNING)).all()
        assert rdb.finish_trial(s, trial_id, state=TrialState.FAIL, value=None,
                                user_attrs={"outcome": "killed"})
        s.execute(update(LayoutClaim).where(LayoutClaim.trial_id == trial_id)
                  .values(lease_until=None, retry=1))
    return int(trial_id)


class _TakenOver(Launcher):
    """The first launch runs until killed, its claim taken over as it starts; later ones
    write a result at once."""

    kind = "taken-over"

    def __init__(self, storage: Storage) -> None:
        super().__init__()
        self.storage, self.launches, self.killed = storage, 0, 0
        self.renewals_after_take_over: int | None = None
        """Renewals of the taken-over trial's lease after the take-over (the retry's own
        lease beats too where its launch outlasts a heartbeat, on a loaded machine)."""
        self.taken: int | None = None

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        self.launches += 1
        if self.launches == 1:
            self.taken = _take_over(self.storage)
            self.renewals_after_take_over = 0
            return "hangs"
        TrialResult(status="ok", model_tflops_per_device=1.0, step_time_s=0.1,
                    world_size=spec.layout.world_size, device="cpu").write(paths.result)
        return "done"

    def _poll(self, handle: Any) -> int | None:
        return 0 if handle == "done" else None

    def _kill(self, handle: Any) -> None:
        self.killed += 1


def _spec(tmp_path: Path) -> StudySpec:
    return parse_study({
        "name": "lease", "model": {"preset": "tiny"},
        "cluster": {"nodes": 1, "devices_per_node": 2, "device": "cpu"},
        "training": {"global_batch": 4, "dtype": "fp32"},
        "search": {"tp": [2], "pp": [1], "micro_batch": [2], "zero_stage": [0],
                   "recompute": ["none"], "n_trials": 1},
        "trial": {"timeout_s": 3600},
        "storage": {"url": f"sqlite:///{tmp_path / 'lease.db'}",
                    "heartbeat_interval_s": 1, "grace_period_s": 2},
        "launcher": {"kind": "local", "run_dir": str(tmp_path / "runs")}})


def test_a_trial_whose_lease_is_taken_over_is_cancelled_within_one_heartbeat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path)
    storage = open_storage(spec.storage)
    launcher = _TakenOver(storage)
    renew = Lease.renew

    def counted(self: Lease) -> bool:
        if launcher.renewals_after_take_over is not None and self.key == launcher.taken:
            launcher.renewals_after_take_over += 1
        return renew(self)

    monkeypatch.setattr(Lease, "renew", counted)
    try:
        out = io.StringIO()
        run_study(spec, storage, launcher, progress=Progress(1, stream=out))
        # Killed after the first renewal that followed the take-over, not at its timeout;
        # the retry (the layout's new holder) launched once more and measured it.
        assert launcher.killed == 1 and launcher.launches == 2
        assert launcher.renewals_after_take_over is not None
        study = optuna.load_study(study_name=spec.name, storage=storage.optuna)
        first, retry = study.get_trials()
        assert first.state == TrialState.FAIL and first.user_attrs["outcome"] == "killed"
        assert retry.state == TrialState.COMPLETE and retry.value == 1.0
        lost = [line for line in out.getvalue().splitlines() if "lease was taken over" in line]
        assert len(lost) == 1 and "trial 0 (" in lost[0] and "launch is cancelled" in lost[0]
    finally:
        storage.close()
    # One beat after the take-over found the lease gone, and the beating stopped there.
    assert launcher.renewals_after_take_over == 1


def test_a_failing_renewal_is_logged_once_and_only_a_refusal_loses_the_lease(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = _spec(tmp_path)
    storage = open_storage(spec.storage)
    try:
        clock = [100.0]
        lease = Lease(storage, LayoutClaim, LayoutClaim.trial_id, 1, "trial 7")
        lease.clock = lambda: clock[0]
        lease._renewed_at = clock[0]
        answers: list[Any] = [RuntimeError("server closed the connection")] * 3 + [False]

        def renew() -> bool:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return bool(answer)

        lease.renew = renew  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="autotune.storage.leases"):
            for _ in range(3):  # the database away, past the grace period: still held
                assert lease.beat() and lease.lost is None
                clock[0] += 2.0
        assert lease.failures == 3
        assert not lease.beat()  # back, and the trial was repaired meanwhile
        assert lease.lost is not None and "taken over after 6 s" in lease.lost
        assert [r.getMessage() for r in caplog.records].count(
            "trial 7: renewing its lease failed (retried each heartbeat): "
            "server closed the connection") == 1
    finally:
        storage.close()
