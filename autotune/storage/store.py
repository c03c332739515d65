"""How a trial lives in the database, in one class: :class:`TrialStore`, one study's door.

Modelled on Optuna's ``BaseStorage`` (optuna v5.1.0, ``optuna/storages/_base.py``): the
loop talks to one object whose methods are the life of a trial, and the tables behind it
stay private. At autotune's level a trial is

1. **claimed** (:meth:`TrialStore.claim`): its layout's claim, its Optuna trial (RUNNING,
   with its parameters) and its ``measurements`` row, in one transaction, with a lease
   (:class:`Claim`: :meth:`Claim.renew`, :attr:`Claim.lost`) that the runner's heartbeat
   renews (:mod:`autotune.runner.lifecycle`);
2. **recorded** (:meth:`TrialStore.record`): its verdict told as its Optuna state (the one
   mapping, :attr:`autotune.trial.outcome.Outcome.state`), its value and per-step values
   (:mod:`autotune.storage.values`), attributes, constraint, measurement row and the
   claim's end, in one transaction; refused when the trial was repaired meanwhile;
3. or **repaired** (:meth:`TrialStore.repair`) when its runner died: ``killed``, and its
   layout waits for a retry (:meth:`TrialStore.retry_keys`).

A proposal refused before launch is stored as one PRUNED trial
(:meth:`TrialStore.refuse`). The reads a loop needs are narrow (:meth:`TrialStore.history`,
:meth:`TrialStore.best`), for every launcher. Every call goes through the one retry layer
(``Storage.retrying``: transient failures waited out, others one line). The confirmation
round's claim has the same lease (:meth:`TrialStore.confirmation`).

The parts behind this door: :mod:`autotune.storage.claims` (the transactions),
:mod:`autotune.storage._optuna_rdb` (Optuna's tables written inside them),
:mod:`autotune.storage.judged` (narrow reads), :mod:`autotune.storage.leases`,
:mod:`autotune.storage.confirmations`, :mod:`autotune.storage.records` and
:mod:`autotune.storage.keys` (what the rows hold).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from autotune.storage import claims, confirmations, judged
from autotune.storage._optuna_rdb import CONSTRAINT_ATTR
from autotune.storage.leases import Lease
from autotune.storage.values import step_tflops, stored_value
from autotune.trial.outcome import Outcome, Verdict

if TYPE_CHECKING:
    from autotune.storage.db import Storage
    from autotune.trial import TrialResult

__all__ = ["TrialStore", "Claim"]

T = TypeVar("T")


@dataclass(frozen=True)
class Claim:
    """A claimed trial and its lease."""

    trial_id: int
    number: int
    attempt: int
    """1 for the layout's first execution, 2 for its first retry, ..."""
    lease: Lease

    def renew(self) -> bool:
        """Move the lease on; ``False`` if it has none any more."""
        return self.lease.renew()

    @property
    def lost(self) -> str | None:
        """Why the lease is lost (once the heartbeat found it so), ``None`` while held."""
        return self.lease.lost


class TrialStore:
    """One study's trials in ``storage`` (module docstring)."""

    def __init__(self, storage: Storage, study_name: str, *, who: str = "worker") -> None:
        self.storage, self.study_name, self.who = storage, study_name, who

    def _retrying(self, fn: Callable[[], T]) -> T:
        return self.storage.retrying(self.who, fn)

    def _claim_of(self, claimed: claims.Claimed, key: str) -> Claim:
        return Claim(claimed.trial_id, claimed.number, claimed.attempt, claims.claim_lease(
            self.storage, claimed.trial_id, f"trial {claimed.number} ({key})"))

    def claim(self, requests: Sequence[claims.ClaimRequest], *, n_trials: int, worker: str,
              retry_only: bool = False, before_commit: Callable[[], None] | None = None
              ) -> tuple[int, Claim] | claims.Refused:
        """Claim the first free one of ``requests``: ``(its index, the claim)`` or why
        none was (:func:`autotune.storage.claims.claim_first`)."""
        got = self._retrying(lambda: claims.claim_first(
            self.storage, study_name=self.study_name, requests=requests, n_trials=n_trials,
            worker=worker, retry_only=retry_only, before_commit=before_commit))
        if isinstance(got, claims.Refused):
            return got
        index, claimed = got
        return index, self._claim_of(claimed, requests[index].key)

    def record(self, claim: Claim, verdict: Verdict, *, result: TrialResult | None,
               user_attrs: Mapping[str, Any], measurement: Mapping[str, Any],
               before_commit: Callable[[], None] | None = None) -> bool:
        """Record a claimed trial's end; ``False`` (nothing written) when it was repaired
        meanwhile and its layout is someone else's."""
        constraint = ({} if verdict.kind.constraint is None
                      else {CONSTRAINT_ATTR: verdict.kind.constraint})
        intermediate = step_tflops(result) if verdict.kind is Outcome.STOPPED else None
        return self._retrying(lambda: claims.record_execution(
            self.storage, trial_id=claim.trial_id, state=verdict.state,
            value=stored_value(verdict), intermediate=intermediate, user_attrs=user_attrs,
            system_attrs=constraint, measurement=measurement, retry=verdict.retry,
            before_commit=before_commit))

    def refuse(self, params: Mapping[str, tuple[Any, BaseDistribution]],
               user_attrs: Mapping[str, Any]) -> int | None:
        """Store a proposal refused before launch (a PRUNED trial, constraint violated)."""
        return self._retrying(lambda: claims.store_verdict(
            self.storage, study_name=self.study_name, params=params, user_attrs=user_attrs))

    def repair(self) -> int:
        """Fail the trials whose runner died; how many."""
        return self._retrying(lambda: claims.repair_stale(self.storage, self.study_name))

    def retry_keys(self) -> list[str]:
        """Layouts waiting for a retry, oldest claim first."""
        return self._retrying(lambda: claims.retry_keys(self.storage, self.study_name))

    def mark_for_retry(self, layout_keys: Sequence[str]) -> None:
        """Put the released claims of ``layout_keys`` up for a retry."""
        self._retrying(lambda: claims.mark_for_retry(self.storage, self.study_name,
                                                     layout_keys))

    def counts(self) -> claims.ClaimCounts:
        return self._retrying(lambda: claims.claim_counts(self.storage, self.study_name))

    def history(self, *, states: Sequence[Any] | None = judged.FINISHED,
                keys: Sequence[str] = judged.HISTORY_KEYS) -> list[judged.JudgedTrial]:
        """The study's trials in ``states``, narrowly read (number, state, value, the
        attributes of ``keys``)."""
        return judged.judged_trials(self.storage, self.study_name, states=states, keys=keys)

    def best(self) -> FrozenTrial | None:
        """The completed trial of highest value, read whole (stopped ones never)."""
        return self._retrying(lambda: judged.read_best_trial(self.storage, self.study_name))

    def best_judged(self) -> judged.JudgedTrial | None:
        """:meth:`best`'s value and number only (one narrow query)."""
        return judged.best_judged(self.storage, self.study_name)

    def confirmation(self, *, basis: str, worker: str
                     ) -> tuple[confirmations.ConfirmClaimed, Lease] | confirmations.ConfirmRefused:
        """Claim the study's confirmation round on these candidates (``basis``), with the
        same lease as a trial's claim (refused once another worker claimed the round)."""
        got = self._retrying(lambda: confirmations.claim_confirmation(
            self.storage, study_name=self.study_name, basis=basis, worker=worker))
        if isinstance(got, confirmations.ConfirmRefused):
            return got
        return got, confirmations.confirmation_lease(self.storage, got.id, worker)
