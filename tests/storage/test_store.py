"""The one door (autotune/storage/store.py): a trial claimed with a lease, recorded once,
refused once repaired; a proposal refused before launch; the confirmation round's claim
with the same kind of lease."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config.study import StorageConfig
from autotune.storage import ClaimRequest, Refused, Storage, TrialStore
from autotune.trial.outcome import Outcome, Verdict
from tests.storage.test_calibration_rows import _row


def _store(tmp_path: Path) -> TrialStore:
    storage = Storage(StorageConfig(url=f"sqlite:///{tmp_path / 's.db'}",
                                    heartbeat_interval_s=1, grace_period_s=2))
    optuna.create_study(study_name="s", storage=storage.optuna, direction="maximize")
    return TrialStore(storage, "s")


def test_claim_record_and_a_record_refused_after_a_repair(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        row = _row("s")
        got = store.claim([ClaimRequest("a", {}, {"layout": "a"}, row),
                           ClaimRequest("b", {}, {"layout": "b"}, row)], n_trials=2,
                          worker="nohost:1")
        assert not isinstance(got, Refused) and got[0] == 0
        claim = got[1]
        assert claim.renew() and claim.lost is None and store.counts().live == 1
        assert store.record(claim, Verdict(Outcome.COMPLETE, value=3.0), result=None,
                            user_attrs={"outcome": "complete"},
                            measurement={**row, "outcome": "complete"})
        assert not claim.renew()  # recorded: the lease is gone
        best = store.best()
        assert best is not None and best.value == 3.0
        # b, then its runner goes silent past the grace period: repaired, and its record
        # is refused, nothing written.
        got = store.claim([ClaimRequest("b", {}, {"layout": "b"}, row)], n_trials=2,
                          worker="nohost:1")
        assert not isinstance(got, Refused)
        late = got[1]
        with store.storage.session() as s:
            from sqlalchemy import update

            from autotune.storage.schema import LayoutClaim

            s.execute(update(LayoutClaim).where(LayoutClaim.trial_id == late.trial_id)
                      .values(lease_until=LayoutClaim.created_at))
        assert store.repair() == 1 and store.retry_keys() == ["b"]
        assert not store.record(late, Verdict(Outcome.COMPLETE, value=9.0), result=None,
                                user_attrs={"outcome": "complete"},
                                measurement={**row, "outcome": "complete"})
        assert [t.state for t in store.history()] == [TrialState.COMPLETE, TrialState.FAIL]
        assert store.refuse({}, {"outcome": "infeasible"}) == 2
        assert store.claim([ClaimRequest("c", {}, {}, row)], n_trials=2,
                           worker="nohost:1") is Refused.BUDGET
    finally:
        store.storage.close()


def test_the_confirmation_round_is_claimed_with_a_lease(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        got = store.confirmation(basis="a,b", worker="nohost:1")
        assert isinstance(got, tuple)
        claimed, lease = got
        assert not claimed.resumed and claimed.launches == 0
        assert lease.renew() and lease.beat() and lease.lost is None
    finally:
        store.storage.close()


def test_a_confirmation_round_taken_over_refuses_its_old_holder(tmp_path: Path) -> None:
    """A takeover keeps the round's row: the old holder's lease and writes are refused by
    the row's worker, not by the lease alone (which the new holder keeps alive)."""
    from sqlalchemy import update

    from autotune.storage import finish_confirmation, record_round, release_confirmation
    from autotune.storage.schema import Confirmation

    store = _store(tmp_path)
    try:
        first = store.confirmation(basis="a,b", worker="nohost:1")
        assert isinstance(first, tuple)
        claimed, old = first
        with store.storage.session() as s:  # its runner silent past the grace period
            s.execute(update(Confirmation).values(lease_until=Confirmation.created_at))
        second = store.confirmation(basis="a,b", worker="nohost:2")
        assert isinstance(second, tuple)
        taken, new = second
        assert taken.id == claimed.id and taken.resumed
        assert not old.beat() and old.lost is not None
        assert "left to the worker that holds it now" in old.lost
        assert new.beat() and new.lost is None
        run = {"round": 0, "slot": 0, "layout_key": "a", "trial_number": 0,
               "outcome": "complete", "world_size": 2, "launcher": "local"}
        assert not record_round(store.storage, claimed.id, study_name="s", runs=[run],
                                launches=1, device_s=1.0, worker="nohost:1")
        assert not release_confirmation(store.storage, claimed.id, "nohost:1")
        assert not finish_confirmation(store.storage, claimed.id, {"winner": "a"}, "nohost:1")
        with store.storage.session() as s:
            row = s.get(Confirmation, claimed.id)
            assert row is not None
            assert (row.worker, row.state, row.launches, row.decision_json) == (
                "nohost:2", "running", 0, None)
            assert row.lease_until is not None
        assert record_round(store.storage, claimed.id, study_name="s", runs=[run],
                            launches=1, device_s=1.0, worker="nohost:2")
    finally:
        store.storage.close()


def test_the_narrow_history_reads_the_timings_a_refit_needs_as_optuna_has_them(
        tmp_path: Path) -> None:
    """The worker's refit reads the trials' timings narrowly (every launcher, not only the
    replay one): the same values as Optuna's whole trials, a trial without them included."""
    from autotune.runner.learning import build_seconds
    from autotune.storage import TrialAttr

    store = _store(tmp_path)
    try:
        study = optuna.load_study(study_name="s", storage=store.storage.optuna)
        for n, timings in enumerate(({"process_start": 2.0, "build": 1.0}, None,
                                     {"process_start": 3.0, "imports": 1.0, "build": 2.5})):
            attrs = {"outcome": "complete", **({TrialAttr.TIMINGS_S: timings} if timings else {})}
            study.add_trial(optuna.trial.create_trial(value=float(n + 1), user_attrs=attrs))
        narrow = store.history(states=None, keys=(TrialAttr.TIMINGS_S,))
        whole = study.get_trials(deepcopy=False)
        assert [t.user_attrs.get(TrialAttr.TIMINGS_S) for t in narrow] == [
            t.user_attrs.get(TrialAttr.TIMINGS_S) for t in whole]
        assert build_seconds(None, (t.user_attrs.get(TrialAttr.TIMINGS_S) or {}
                                    for t in narrow)) == build_seconds(
            None, (t.user_attrs.get(TrialAttr.TIMINGS_S) or {} for t in whole))
    finally:
        store.storage.close()
