"""A confirmation round whose lease is lost stops its launch: another worker that claimed
the round meanwhile (as after an outage longer than the grace period) holds it now, so the
loser's launch is killed, it says so in one line, stores no round more and neither
releases nor decides the round. In one rotating launch (the real trainer on 2 CPU ranks,
tens of seconds) and in one launch per run (a launcher that hangs until killed, where the
heartbeat's refused renewal is what finds it: seconds)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import update

from autotune.launchers import make_launcher
from autotune.launchers.base import Launcher
from autotune.runner import confirm as confirm_module
from autotune.runner import confirm_rotation
from autotune.runner.confirm import ConfirmResult, confirm_best
from autotune.runner.confirm_budget import SearchCost
from autotune.storage.confirmations import stored_runs
from autotune.storage.db import Storage, open_storage
from autotune.storage.keys import StudyAttr
from autotune.storage.leases import utcnow
from autotune.storage.schema import Confirmation
from autotune.trial import TrialPaths, TrialSpec
from tests.runner.test_confirm_rotation import _spec, _study_with_two_close_trials

OTHER = "elsewhere:1"
"""The worker that takes the round over."""


def _take_over(storage: Storage) -> Any:
    """What another worker's claim of a lapsed round writes: itself, and a fresh lease."""
    until = (utcnow() + timedelta(hours=1)).replace(microsecond=0)
    with storage.session() as s:
        s.execute(update(Confirmation).values(worker=OTHER, lease_until=until))
    return until


def _assert_left_alone(storage: Storage, study: optuna.Study, result: ConfirmResult,
                       until: Any, seen: list[str]) -> None:
    """Nothing more stored by the loser; the round as its new holder has it; one line."""
    assert result.record is None and result.ended is None, result.line
    assert "lease was taken over" in result.line
    assert "left to the worker that holds it now" in result.line
    assert "launch is cancelled" in result.line and "unconfirmed" in result.line
    assert not [line for line in seen if "lease" in line]  # the result's line is the one
    assert stored_runs(storage, 1) == []
    with storage.session() as s:
        row = s.get(Confirmation, 1)
        assert row is not None
        assert (row.worker, row.state, row.lease_until, row.launches, row.device_s,
                row.decision_json) == (OTHER, "running", until, 0, 0.0, None)
    study = optuna.load_study(study_name=study.study_name, storage=storage.optuna)
    assert StudyAttr.CONFIRMATION not in study.user_attrs


def test_a_rotation_taken_over_is_killed_and_stores_nothing_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, confirm_max_rounds=12)
    storage = open_storage(spec.storage)
    study = _study_with_two_close_trials(spec)
    monkeypatch.setattr(confirm_module, "search_cost",
                        lambda *_: SearchCost(10.0, {0: 1.0, 1: 1.0}, 10))
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                             workload=spec.workload)
    taken: dict[str, Any] = {}
    original_runs, original_rotation = confirm_rotation.round_runs, confirm_rotation.run_rotation

    def taken_over_at_the_first_round(*args: Any, **kw: Any) -> list[dict[str, Any]]:
        if not taken:
            taken["until"], taken["at"] = _take_over(storage), time.monotonic()
        return original_runs(*args, **kw)

    outcomes: list[confirm_rotation.RotationOutcome] = []

    def kept(*args: Any, **kw: Any) -> confirm_rotation.RotationOutcome:
        outcomes.append(original_rotation(*args, **kw))
        return outcomes[-1]

    monkeypatch.setattr(confirm_rotation, "round_runs", taken_over_at_the_first_round)
    monkeypatch.setattr(confirm_rotation, "run_rotation", kept)
    seen: list[str] = []
    try:
        result = confirm_best(spec, storage, study, launcher, worker="w", say=seen.append)
        took_s = time.monotonic() - taken["at"]
        # The launch was killed, not run to its schedule's end; one launch, no other.
        (out,) = outcomes
        assert out.report.interrupted
        assert len((out.data or {}).get("rounds") or []) < 12
        assert took_s < 60  # about a heartbeat (1 s) and a kill; generous for a loaded CI
        _assert_left_alone(storage, study, result, taken["until"], seen)
    finally:
        storage.close()


class _Hangs(Launcher):
    """A confirmation run that hangs until killed; the round is taken over as the first
    one starts."""

    kind = "hangs"

    def __init__(self, storage: Storage) -> None:
        super().__init__()
        self.storage = storage
        self.started: list[float] = []
        self.killed: list[float] = []
        self.until: Any = None

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        if not self.started:
            self.until = _take_over(self.storage)
        self.started.append(time.monotonic())
        return "hangs"

    def _poll(self, handle: Any) -> int | None:
        return 0 if handle == "killed" else None

    def _kill(self, handle: Any) -> None:
        self.killed.append(time.monotonic())


def test_runs_taken_over_are_killed_at_the_next_heartbeat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path)
    storage = open_storage(spec.storage)
    study = _study_with_two_close_trials(spec)
    monkeypatch.setattr(confirm_module, "search_cost",
                        lambda *_: SearchCost(10.0, {0: 1.0, 1: 1.0}, 10))
    launcher = _Hangs(storage)
    assert not confirm_rotation.rotates(launcher)  # one launch per run
    seen: list[str] = []
    try:
        result = confirm_best(spec, storage, study, launcher, worker="w", say=seen.append)
        # Killed by the heartbeat's refused renewal, not at the run's timeout (120 s); the
        # runs after it in the same step were killed as they started.
        assert launcher.killed and len(launcher.killed) == len(launcher.started)
        assert launcher.killed[0] - launcher.started[0] < 60
        assert not launcher.cancelled  # a lost lease is no Ctrl-C: no exit 130
        _assert_left_alone(storage, study, result, launcher.until, seen)
    finally:
        storage.close()


def test_the_line_is_the_same_whichever_finds_the_takeover_first(tmp_path: Path) -> None:
    """The heartbeat's refused renewal or a refused write of a round: under load either
    comes first, and the user reads the same words."""
    from autotune.storage.confirmations import claim_confirmation, confirmation_lease

    spec = _spec(tmp_path)
    storage = open_storage(spec.storage)
    _study_with_two_close_trials(spec)
    claimed = claim_confirmation(storage, study_name=spec.name, basis="b", worker="w")
    by_write = confirm_module._left(confirmation_lease(storage, claimed.id, "w")).line
    lease = confirmation_lease(storage, claimed.id, "w")
    _take_over(storage)
    assert not lease.renew()
    by_heartbeat = confirm_module._left(lease).line
    for line in (by_write, by_heartbeat):
        assert "lease was taken over" in line and "left to the worker that holds it now" in line
        assert "nothing more is stored" in line
