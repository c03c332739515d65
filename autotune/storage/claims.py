"""Layout claims with leases: a trial is alive in the database from its claim to its record.

A SIGKILL may come between any two commits: were a step several transactions, it could
leave a trial created before its claim and its first heartbeat (RUNNING for ever), a result
half recorded (a FAIL trial carrying values, or a measurement Optuna never saw), a lost
claim race stored as a junk trial. Here each step is one transaction:

* :func:`claim_layout` locks the study, checks the layout's claim and the budget, and
  creates the Optuna trial (RUNNING, with its parameters), the claim with its lease and
  the execution's ``measurements`` row (outcome ``running``) together; a refused claim
  stores nothing; :func:`claim_first` does the same for the first free one of a few
  layouts (a worker's next proposals, when other workers race it);
* :func:`renew_lease` (the runner's heartbeat) moves the lease on;
* :func:`record_execution` writes the values, attributes, constraint, state, the
  measurement row and the claim's end (lease cleared, ``retry`` if it was cut short);
* :func:`repair_stale` fails a RUNNING trial whose lease ran out (and that has no live
  Optuna heartbeat either, for trials of earlier versions): its measurement row becomes
  ``killed`` and its claim ``retry``, so the next worker measures the layout again
  within the budget (at most :data:`MAX_ATTEMPTS` executions).

A kill at any instant therefore leaves either a finished trial or a RUNNING one with a
lease, which the next run, ``autotune status`` or ``campaign check`` repairs once the lease
is over (``storage.grace_period_s``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from optuna.distributions import BaseDistribution
from optuna.storages._rdb import models
from optuna.trial import TrialState
from sqlalchemy import func, select, update

from autotune.storage import _optuna_rdb as rdb
from autotune.storage.keys import RUNNING, TrialAttr
from autotune.storage.leases import Lease, dead_here, utcnow
from autotune.storage.schema import LayoutClaim, Measurement
from autotune.trial.outcome import Outcome

if TYPE_CHECKING:
    from autotune.storage.db import Storage

__all__ = ["MAX_ATTEMPTS", "Claimed", "Refused", "ClaimCounts", "ClaimRequest",
           "claim_layout", "claim_first", "claim_lease", "renew_lease", "record_execution",
           "repair_stale", "claim_counts", "retry_keys", "store_verdict", "KILLED_REASON"]

MAX_ATTEMPTS = 3
"""Executions of one layout at most (the first and two retries), as Optuna's
``RetryHeartbeatStaleTrialCallback(max_retry=3)`` did before."""

KILLED_REASON = ("the runner died before recording the result (SIGKILL, node failure): "
                 "its lease ran out")


@dataclass(frozen=True)
class Claimed:
    trial_id: int
    number: int
    attempt: int
    """1 for the layout's first execution, 2 for its first retry, ..."""


class Refused(Enum):
    TAKEN = "taken"
    """Another trial owns the layout (running, measured, or out of retries)."""
    BUDGET = "budget"
    """The study's budget is claimed."""
    NO_STUDY = "no-study"


@dataclass(frozen=True)
class ClaimCounts:
    claimed: int
    """Layouts claimed: measured, being measured or waiting for a retry (the budget)."""
    retries: int
    """Claims whose last execution was cut short: a runner started now re-runs them."""
    live: int
    """Claims with a lease: being measured."""


@dataclass(frozen=True)
class ClaimRequest:
    """One layout a worker would claim: what its trial and ``measurements`` row hold."""

    key: str
    params: Mapping[str, tuple[Any, BaseDistribution]]
    user_attrs: Mapping[str, Any]
    measurement: Mapping[str, Any]
    """The execution's ``measurements`` row without its trial's id and number."""


def claim_layout(storage: Storage, *, study_name: str, key: str, n_trials: int,
                 worker: str, params: Mapping[str, tuple[Any, BaseDistribution]],
                 user_attrs: Mapping[str, Any], measurement: Mapping[str, Any],
                 retry_only: bool = False,
                 before_commit: Callable[[], None] | None = None) -> Claimed | Refused:
    """Claim layout ``key`` and create its trial, in one transaction.

    A new layout is claimed while fewer than ``n_trials`` are; a layout whose claim waits
    for a retry is taken over (within the budget: its place is already counted). With
    ``retry_only`` a free layout is refused (the caller only wanted the retry).
    ``measurement`` is the execution's ``measurements`` row without its trial's id and
    number (filled in here).
    """
    got = claim_first(storage, study_name=study_name, n_trials=n_trials, worker=worker,
                      requests=[ClaimRequest(key, params, user_attrs, measurement)],
                      retry_only=retry_only, before_commit=before_commit)
    return got if isinstance(got, Refused) else got[1]


def claim_first(storage: Storage, *, study_name: str, requests: Sequence[ClaimRequest],
                n_trials: int, worker: str, retry_only: bool = False,
                before_commit: Callable[[], None] | None = None
                ) -> tuple[int, Claimed] | Refused:
    """Claim the first of ``requests`` that is free (as :func:`claim_layout` decides for
    one), in one transaction: ``(its index, the claim)``, or why none was.

    Many workers read the same history and their strategy proposes the same layout to
    each: claiming one layout at a time, all but one would lose the race and read
    everything again, so a step's work would grow with the workers. Under the study lock
    the claims are serialised, so a worker that passes its next few proposals gets the
    first one nobody took meanwhile.
    """
    if not requests:
        return Refused.TAKEN
    lease = utcnow() + timedelta(seconds=storage.config.grace_period_s)
    with storage.session() as s:
        study_id = rdb.study_id_of(s, study_name)
        if study_id is None:
            return Refused.NO_STUDY
        # Before the lock, a plain read: requests that others own already are dropped, and
        # a worker all of whose requests are taken leaves without queueing for the study's
        # lock (with many workers on one study, most claims under the lock would be lost,
        # each after waiting for the lock behind the others). Claims are
        # only ever added, so what is taken now is taken under the lock too; a claim
        # repaired for a retry meanwhile is taken by the next retry look.
        taken = {row.layout_key for row in s.scalars(select(LayoutClaim).where(
            LayoutClaim.study_name == study_name,
            LayoutClaim.layout_key.in_([r.key for r in requests])))
            if not _waits_for_retry(row)}
        order = [i for i, r in enumerate(requests) if r.key not in taken]
        if not order:
            return Refused.TAKEN
        rdb.lock_study(s, study_id)
        requests = [requests[i] for i in order]
        keys = [r.key for r in requests]
        rows = {row.layout_key: row for row in s.scalars(select(LayoutClaim).where(
            LayoutClaim.study_name == study_name, LayoutClaim.layout_key.in_(keys))
            .with_for_update())}
        count: int | None = None
        refused = Refused.TAKEN
        for index, req in enumerate(requests):
            row = rows.get(req.key)
            if row is not None and not _waits_for_retry(row):
                continue
            if row is None:
                if retry_only:
                    continue
                if count is None:
                    count = s.scalar(select(func.count()).select_from(LayoutClaim).where(
                        LayoutClaim.study_name == study_name)) or 0
                if count >= n_trials:
                    refused = Refused.BUDGET  # a later request may still be a retry
                    continue
            return order[index], _create_claimed(s, study_id, study_name, req, row, worker,
                                                 lease, before_commit)
        return refused


def _waits_for_retry(row: LayoutClaim) -> bool:
    """Whether a layout's claim may be taken over: it waits for a retry (flagged, no live
    lease) and has attempts left."""
    return bool(row.retry) and row.lease_until is None and row.attempts < MAX_ATTEMPTS


def _create_claimed(s: Any, study_id: int, study_name: str, req: ClaimRequest,
                    row: LayoutClaim | None, worker: str, lease: datetime,
                    before_commit: Callable[[], None] | None) -> Claimed:
    """The claim's trial, claim row and ``measurements`` row (``row``: a retry's claim)."""
    attempt = 1 if row is None else row.attempts + 1
    attrs = dict(req.user_attrs)
    if row is not None:
        attrs[TrialAttr.RETRY_OF] = _number_of(s, row.trial_id)
    trial_id, number = rdb.create_trial(s, study_id, state=TrialState.RUNNING,
                                        params=req.params, user_attrs=attrs)
    if row is None:
        s.add(_new_claim(study_name, req.key, trial_id=trial_id, worker=worker, lease=lease))
    else:
        row.trial_id, row.worker, row.lease_until = trial_id, worker, lease
        row.attempts, row.retry = attempt, 0
    s.add(Measurement(**{**req.measurement, "trial_id": trial_id, "trial_number": number,
                         "outcome": RUNNING}))
    if before_commit is not None:
        s.flush()
        before_commit()
    return Claimed(trial_id, number, attempt)


def _new_claim(study_name: str, key: str, *, trial_id: int, worker: str,
               lease: datetime) -> LayoutClaim:
    """A layout's claim row for its first execution: ``trial_id``'s, leased to ``worker``
    until ``lease``, one attempt counted, no retry waiting."""
    return LayoutClaim(study_name=study_name, layout_key=key, trial_id=trial_id,
                       worker=worker, created_at=utcnow(), lease_until=lease, attempts=1,
                       retry=0)


def _number_of(s: Any, trial_id: int) -> int | None:
    return s.scalar(select(models.TrialModel.number).where(
        models.TrialModel.trial_id == trial_id))


def claim_lease(storage: Storage, trial_id: int, what: str | None = None) -> Lease:
    """The lease of ``trial_id``'s claim (:class:`~autotune.storage.leases.Lease`);
    ``what``: the trial for people (default: its id)."""
    return Lease(storage, LayoutClaim, LayoutClaim.trial_id, trial_id,
                 what or f"trial id {trial_id}")


def renew_lease(storage: Storage, trial_id: int) -> bool:
    """Move the lease of ``trial_id``'s claim on; ``False`` if it has none any more (it
    was recorded, or repaired after a silence longer than the grace period)."""
    return claim_lease(storage, trial_id).renew()


def record_execution(storage: Storage, *, trial_id: int, state: TrialState,
                     value: float | None, user_attrs: Mapping[str, Any],
                     system_attrs: Mapping[str, Any], measurement: Mapping[str, Any],
                     retry: bool, before_commit: Callable[[], None] | None = None,
                     intermediate: Mapping[int, float] | None = None) -> bool:
    """Record an execution's end in one transaction: the trial's values, intermediate
    values, attributes, constraint and state, its ``measurements`` row, the claim's end.
    ``False`` (nothing written) when the trial was repaired meanwhile (its runner was
    silent for longer than the grace period)."""
    with storage.session() as s:
        if not rdb.finish_trial(s, trial_id, state=state, value=value,
                                user_attrs=user_attrs, system_attrs=system_attrs,
                                intermediate=intermediate):
            s.rollback()
            return False
        s.execute(update(Measurement).where(Measurement.trial_id == trial_id)
                  .values(**{k: v for k, v in measurement.items()
                             if k not in ("trial_id", "trial_number")}))
        s.execute(update(LayoutClaim).where(LayoutClaim.trial_id == trial_id)
                  .values(lease_until=None, retry=1 if retry else 0))
        s.execute(update(LayoutClaim).where(LayoutClaim.trial_id == trial_id,
                                            LayoutClaim.attempts >= MAX_ATTEMPTS)
                  .values(retry=0))
        if before_commit is not None:
            before_commit()
    return True


def store_verdict(storage: Storage, *, study_name: str,
                  params: Mapping[str, tuple[Any, BaseDistribution]],
                  user_attrs: Mapping[str, Any]) -> int | None:
    """A proposal refused before launch (infeasible), stored as a PRUNED trial with a
    violated constraint in one transaction (constraint-aware samplers learn from it)."""
    with storage.session() as s:
        study_id = rdb.study_id_of(s, study_name)
        if study_id is None:
            return None
        rdb.lock_study(s, study_id)
        _, number = rdb.create_trial(
            s, study_id, state=TrialState.PRUNED, params=params, user_attrs=user_attrs,
            system_attrs={rdb.CONSTRAINT_ATTR: 1.0})
        return number


def repair_stale(storage: Storage, study_name: str) -> int:
    """Fail the study's RUNNING trials whose runner died; how many were repaired.

    Dead: no live lease and no Optuna heartbeat within the grace period (a trial of an
    earlier version has a heartbeat and no lease), and started before the grace period.
    Each repair is its own transaction, checked again under the trial's row lock, so
    concurrent repairers and a late recorder never both win.
    """
    now = utcnow()
    limit = now - timedelta(seconds=storage.config.grace_period_s)
    T, C, H = models.TrialModel, LayoutClaim, models.TrialHeartbeatModel
    with storage.session() as s:
        study_id = rdb.study_id_of(s, study_name)
        if study_id is None:
            return 0
        rows = s.execute(
            select(T.trial_id, C.lease_until, func.max(H.heartbeat), T._datetime_start_utc,
                   C.worker)
            .outerjoin(C, C.trial_id == T.trial_id).outerjoin(H, H.trial_id == T.trial_id)
            .where(T.study_id == study_id, T.state == TrialState.RUNNING)
            .group_by(T.trial_id, C.lease_until, T._datetime_start_utc, C.worker)).all()
    stale = [tid for tid, lease, beat, start, worker in rows
             if dead_here(worker) or (
                 (lease is None or lease < now) and (beat is None or beat < limit)
                 and (lease is not None or start is None or start < limit))]
    repaired = 0
    for trial_id in stale:
        with storage.session() as s:
            row = s.scalars(select(C).where(C.trial_id == trial_id).with_for_update()).first()
            if (row is not None and row.lease_until is not None and row.lease_until >= now
                    and not dead_here(row.worker)):
                continue  # renewed meanwhile
            if not rdb.finish_trial(s, trial_id, state=TrialState.FAIL, value=None,
                                    user_attrs={TrialAttr.OUTCOME: Outcome.KILLED.value,
                                                TrialAttr.REASON: KILLED_REASON}):
                continue
            s.execute(update(Measurement).where(Measurement.trial_id == trial_id,
                                                Measurement.outcome == RUNNING)
                      .values(outcome=Outcome.KILLED.value, reason=KILLED_REASON,
                              finished_at=now))
            if row is not None:
                row.lease_until = None
                row.retry = 1 if row.attempts < MAX_ATTEMPTS else 0
            repaired += 1
    return repaired


def claim_counts(storage: Storage, study_name: str) -> ClaimCounts:
    """The budget's counts (one query); call :func:`repair_stale` first."""
    with storage.session() as s:
        claimed, retries, live = s.execute(
            select(func.count(), func.coalesce(func.sum(LayoutClaim.retry), 0),
                   func.count(LayoutClaim.lease_until))
            .where(LayoutClaim.study_name == study_name)).one()
    return ClaimCounts(int(claimed), int(retries), int(live))


def retry_keys(storage: Storage, study_name: str) -> list[str]:
    """Layouts waiting for a retry, oldest claim first."""
    with storage.session() as s:
        return list(s.scalars(select(LayoutClaim.layout_key).where(
            LayoutClaim.study_name == study_name, LayoutClaim.retry == 1,
            LayoutClaim.lease_until.is_(None), LayoutClaim.attempts < MAX_ATTEMPTS)
            .order_by(LayoutClaim.id)))


def mark_for_retry(storage: Storage, study_name: str, layout_keys: Sequence[str]) -> None:
    """Put the released claims of ``layout_keys`` up for a retry (``run --retry-failed``)."""
    with storage.session() as s:
        s.execute(update(LayoutClaim).where(
            LayoutClaim.study_name == study_name,
            LayoutClaim.layout_key.in_(list(layout_keys)),
            LayoutClaim.lease_until.is_(None)).values(retry=1))
