"""The proposing half of a worker's loop: repair dead runners' trials, take retries first,
ask the strategy, check and claim its proposal (its trial created with the claim), back
off after races lost to other workers. :class:`~autotune.runner.worker.Worker` adds the
loop, the measuring and the recording."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import optuna

from autotune.errors import AutotuneError
from autotune.feasibility import Constraints, Reason
from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.planning.candidates import Candidate
from autotune.runner.budget import budget_reached
from autotune.runner.facts import FactsBuilder
from autotune.runner.kill_points import test_kill_point
from autotune.runner.optuna_io import history, layout_params, set_search_stop
from autotune.runner.proposals import next_proposals
from autotune.runner.summary import RunSummary
from autotune.search import Observation, Strategy, dominated_by_oom
from autotune.spec import StudySpec
from autotune.storage import (
    Claim,
    ClaimRequest,
    Refused,
    Storage,
    TrialAttr,
    TrialStore,
    search_stop_of,
    search_stop_record,
    utcnow,
    verdict_attrs,
)
from autotune.trial.outcome import StopReason, infeasible

T = TypeVar("T")

__all__ = ["Proposing"]

_LOST_RACE_BACKOFF_S = 0.1
_MAX_SPREAD = 64
"""Proposals a worker racing others passes to one claim at most (:meth:`Proposing._admit`)."""
_REPAIR_EVERY_S = 1.0
"""How often a worker looks for dead runners' trials and retries while it proposes: each
look is two queries, a dead runner's lease lasts ``storage.grace_period_s`` anyway, and
a worker about to stop always looks first."""


class Proposing:
    """A worker's proposing and claiming (see the module docstring); the attributes below
    are the worker's."""

    spec: StudySpec
    storage: Storage
    store: TrialStore
    study: optuna.Study
    launcher: Launcher
    strategy: Strategy
    constraints: Constraints
    plan: list[Layout]
    by_key: dict[str, Candidate]
    n_trials: int
    name: str
    summary: RunSummary
    _builder: FactsBuilder
    _claims: dict[str, int]
    _last_claim_id: int
    _spread: int
    _repaired_at: float | None

    def _recalibrate(self, observed: list[Observation], *, final: bool = False) -> None:
        raise NotImplementedError

    def _record_recovered(self, claimed: Claim, layout: Layout) -> bool:
        raise NotImplementedError

    def _retrying(self, fn: Callable[[], T]) -> T:
        return self.storage.retrying(f"worker {self.name}", fn)

    def _step(self) -> tuple[Claim, Layout] | StopReason | None:
        """Repair (every :data:`_REPAIR_EVERY_S`, and before any stop), then claim a retry
        or the strategy's next layout: the claim and its trial (measure it), a stop reason,
        or ``None`` (nothing claimed: propose again)."""
        looked = self._repair_due()
        retry = self._take_retry() if looked else None
        if retry is not None:
            return retry
        claimed_keys = self._claimed_keys()
        if budget_reached(len(claimed_keys), self.n_trials):
            if not looked:  # never stop before a dead runner's layout is retried
                return self._take_retry() or StopReason.BUDGET
            return StopReason.BUDGET
        observed = history(self.storage, self.study.study_name, claimed_keys)
        self._recalibrate(observed)
        proposal = self.strategy.propose(self.plan, observed)
        stop = self.strategy.stop
        if proposal is None and not looked:  # never stop before a retry is taken
            retry = self._take_retry()
            if retry is not None:
                return retry
        if proposal is None and stop is not None:
            self.summary.stop_reason = stop.reason
            set_search_stop(self.study, search_stop_record(
                stop.reason, judged=stop.judged, strategy=self.strategy.name,
                min_improvement=self.spec.search.min_improvement, worker=self.name,
                at=utcnow()))
            return StopReason.STRATEGY
        if proposal is None:
            return StopReason.EXHAUSTED
        if search_stop_of(self.study) is not None:
            # An earlier stop no longer holds (another threshold, or new measurements).
            set_search_stop(self.study, None)
        return self._admit(proposal, observed)

    def _repair_due(self) -> bool:
        """Whether to look for dead runners' trials and retries now (:data:`_REPAIR_EVERY_S`)."""
        now = time.monotonic()
        if self._repaired_at is not None and now - self._repaired_at < _REPAIR_EVERY_S:
            return False
        self._repaired_at = now
        return True

    def _take_retry(self) -> tuple[Claim, Layout] | None:
        """Repair dead runners' trials, then claim a layout waiting for a retry, if any."""
        self._repaired_at = time.monotonic()
        self.store.repair()
        for key in self.store.retry_keys():
            if key not in self.by_key:
                continue  # outside the space as it is now: not this worker's to re-run
            claimed = self._claim(Layout.from_key(key), retry_only=True)
            if isinstance(claimed, Claim):
                if self._record_recovered(claimed, Layout.from_key(key)):
                    continue
                return claimed, Layout.from_key(key)
        return None

    def _admit(self, layout: Layout, observed: list[Observation]) -> tuple[Claim, Layout] \
            | StopReason | None:
        """Check the proposal, then claim it (its trial is created with the claim).

        A worker that lost a race for its proposal passes its next ones too, up to
        :data:`_MAX_SPREAD` (doubling after each lost race, one less after a claim of its
        first choice: the contention a worker met lasts as long as the other workers, and
        halving it at once sent 64 workers back to racing for one layout each step): the
        claim takes the first one still free, instead of every worker
        of a study reading it all again for each layout one of them won. A
        worker alone never loses and passes its proposal alone."""
        key = layout.key()
        if key not in self.by_key:
            # Strategies pick from self.plan; a layout outside it is no candidate of the
            # study's space (the planner's enumeration) and is never stored or measured.
            raise AutotuneError(f"strategy {self.strategy.name!r} proposed {key}, which is "
                                "not a candidate of the study's space")
        reasons = self.constraints.check(layout, self.spec.model)
        oom = dominated_by_oom(layout, observed)
        if oom is not None:
            reasons.append(Reason("oom_dominated", f"needs at least the memory of "
                                  f"{oom.key()}, which ran out of memory"))
        if reasons:
            outcome = infeasible(reasons)
            self.store.refuse(
                params=layout_params(layout, self.spec),
                user_attrs=verdict_attrs(layout, outcome.kind, outcome.reason,
                                         worker=self.name))
            self.summary.infeasible += 1
            return None
        layouts = next_proposals(
            self.strategy, self.plan, observed, layout, self._spread,
            admissible=lambda lay: lay.key() in self.by_key and not self.constraints.check(
                lay, self.spec.model) and dominated_by_oom(lay, observed) is None)
        got = self._claim_first(layouts)
        if got is Refused.BUDGET:
            return StopReason.BUDGET
        if not isinstance(got, Refused):
            index, claimed = got
            if index == 0:
                self._spread = max(1, self._spread - 1)
            return claimed, layouts[index]
        # Others own them all (pending in the next history). Workers that lost the same
        # race wait a little, each a different while, so that their next proposals see
        # each other's claims instead of racing again for one layout; the more races lost
        # (the wider the spread), the longer: on a crowded machine the lock's holder needs
        # the CPU that racing losers take (at most 2 s, nothing beside a real trial).
        self._spread = min(_MAX_SPREAD, self._spread * 2)
        time.sleep(random.uniform(0.0, min(2.0, _LOST_RACE_BACKOFF_S * self._spread / 2)))
        return None

    def _claim(self, layout: Layout, *, retry_only: bool = False) -> Claim | Refused:
        got = self._claim_first([layout], retry_only=retry_only)
        return got if isinstance(got, Refused) else got[1]

    def _claim_first(self, layouts: list[Layout], *, retry_only: bool = False
                     ) -> tuple[int, Claim] | Refused:
        """Claim the first free one of ``layouts`` (:func:`~autotune.storage.claims.
        claim_first`), its trial created with the claim."""
        requests = []
        for layout in layouts:
            cand = self.by_key.get(layout.key())
            # The claim-time row: no outcome yet (RUNNING until the record replaces it).
            facts = self._builder.facts(layout, trial_id=0, number=0, outcome=None, t0=utcnow(),
                                elapsed_s=0.0, result=None, hosts=[], paths=None, cand=cand)
            attrs = {TrialAttr.LAYOUT: layout.key(), TrialAttr.LAYOUT_DICT: layout.to_dict(),
                     TrialAttr.WORKER: self.name, TrialAttr.LAUNCHER: self.launcher.kind}
            requests.append(ClaimRequest(layout.key(), layout_params(layout, self.spec),
                                         attrs, self._builder.row(facts)))
        return self.store.claim(requests, n_trials=self.n_trials, worker=self.name,
                                retry_only=retry_only,
                                before_commit=lambda: test_kill_point("in-claim"))

    def _claimed_keys(self) -> dict[str, int]:
        """The study's claimed layouts, read incrementally (new claims only)."""
        for claim_id, key, trial_id in self._retrying(
                lambda: self.storage.claims_since(self.spec.name, self._last_claim_id)):
            self._claims[key] = trial_id
            self._last_claim_id = max(self._last_claim_id, claim_id)
        return self._claims
