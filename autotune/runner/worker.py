"""One worker's loop over a shared study (:mod:`autotune.runner.study` runs the workers;
its docstring has what the loop guarantees): repair, retries first, propose, admit, claim,
measure, record. Also the fault-injection tests' kill and stop points (a test hook)."""


from __future__ import annotations

import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import AutotuneError
from autotune.feasibility import Constraints, Reason
from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.planning.candidates import Candidate
from autotune.runner import stop_early
from autotune.runner.budget import budget_reached
from autotune.runner.learning import (
    StudyLearning,
    build_seconds,
    trial_seconds,
)
from autotune.runner.lifecycle import Busy, StopSignals, heartbeat
from autotune.runner.optuna_io import history, layout_params, observations, set_search_stop
from autotune.runner.progress import Progress
from autotune.runner.proposals import next_proposals
from autotune.runner.recovered import finished_result
from autotune.search import (
    Observation,
    cost_model_predictor,
    dominated_by_oom,
    make_strategy,
    plan_order,
)
from autotune.spec import StudySpec
from autotune.storage import (
    FINISHED,
    SUMMARY_KEYS,
    AnyTrial,
    Claim,
    ClaimRequest,
    Lease,
    Refused,
    Storage,
    StudyAttr,
    TrialAttr,
    TrialFacts,
    TrialStore,
    highest,
    learned_from_record,
    measurement_row,
    search_stop_of,
    search_stop_record,
    set_user_attrs,
    user_attrs,
    utcnow,
    verdict_attrs,
    whole,
)
from autotune.trial import LaunchReport, TrialPaths, TrialResult, TrialSpec
from autotune.trial.classify import classify
from autotune.trial.outcome import StopReason, Verdict, infeasible

T = TypeVar("T")

__all__ = ["RunSummary", "Worker", "TEST_KILL_ENV", "TEST_STOP_ENV"]

_MAX_IDLE_PROPOSALS = 200
_LOST_RACE_BACKOFF_S = 0.1
_SIBLING_POLL_S = 0.5
_MAX_SPREAD = 64
"""Proposals a worker racing others passes to one claim at most (:meth:`Worker._admit`)."""
_REPAIR_EVERY_S = 1.0
"""How often a worker looks for dead runners' trials and retries while it proposes: each
look is two queries, a dead runner's lease lasts ``storage.grace_period_s`` anyway, and
a worker about to stop always looks first."""


@dataclass
class RunSummary:
    measured: int = 0
    """Trials this worker launched."""
    infeasible: int = 0
    stopped_by: StopReason = StopReason.BUDGET
    """``budget``, ``timeout``, ``exhausted``, ``strategy`` (it stopped early: see
    ``stop_reason``), ``broken_program`` (trials failed alike: :mod:`autotune.runner.
    stop_early`; ``stop_reason`` has the error line and the trial folders), ``interrupt``,
    ``sigterm``, ``confirm_interrupt`` or ``confirm_timeout`` (Ctrl-C or the wall-time
    limit in the confirmation round: :func:`autotune.runner.study.run_study`), or
    ``node_failure`` (a node of this
    worker's group died; ``stop_reason`` says which; with several groups, only when every
    group lost one)."""
    stop_reason: str | None = None
    """With ``strategy``: the strategy's reason, e.g. ``expected improvement 0.31% < 1%
    after 6 trials (14 layouts untried)``."""
    best: FrozenTrial | None = None
    trials: Sequence[AnyTrial] = field(default_factory=list)
    """The study's trials at the end, each with the attributes of
    :data:`~autotune.storage.judged.SUMMARY_KEYS` (a narrow read; ``best`` is whole)."""
    confirmation: dict[str, Any] | None = None
    """The confirmation round's record when this run made or read it
    (:func:`autotune.runner.confirm.confirmation_record`); ``best`` is then its winner."""


class Worker:
    """One worker's loop over the shared study (see the module docstring)."""

    def __init__(self, spec: StudySpec, storage: Storage, study: optuna.Study,
                 launcher: Launcher, learning: StudyLearning, n_trials: int,
                 progress: Progress, *, name_suffix: str = "", siblings: int = 1,
                 busy: Busy | None = None) -> None:
        self.spec, self.storage, self.launcher = spec, storage, launcher
        self.store = TrialStore(storage, spec.name)
        self.siblings = siblings
        """Workers of this run side by side: a batch takes no more than its share of
        what is left of the budget, so that none of them idles while one measures all."""
        self.learning = learning
        self.constraints: Constraints = learning.constraints
        self._set_candidates(learning.candidates())
        self._judged: int | None = None  # ok + oom observations the calibration has seen
        self.n_trials, self.progress = n_trials, progress
        self.study = study
        self.strategy = make_strategy(
            spec.search.strategy, seed=spec.search.seed,
            predict=cost_model_predictor(
                spec.model, spec.cluster, dtype=spec.training.dtype, profile=spec.profile,
                known={c.layout: c.predicted_tflops for c in self.by_key.values()}),
            p_fit=lambda lay: self.by_key[lay.key()].p_fit if lay.key() in self.by_key
            else 0.0,
            min_improvement=spec.search.min_improvement,
            warm_start=learning.calibration.residuals,
            cost=lambda lay: trial_seconds(self.by_key.get(lay.key()), self._run_config,
                                           self._build_s))
        self._run_config = spec.run_config()
        # What a failed build costs: the launcher's figure (a replay), else measured.
        self._build_s = build_seconds(getattr(launcher, "build_s", None), ())
        self.name_suffix = name_suffix
        self.name = f"{socket.gethostname()}:{os.getpid()}{name_suffix}"
        self.batch_size = spec.trial.batch_size if launcher.batches else 1
        self.summary = RunSummary()
        self.busy = busy or Busy()
        self._claims: dict[str, int] = {}
        self._last_claim_id = 0
        self._spread = 1
        """Proposals passed to the next claim: 1 alone, more after lost races."""
        self._repaired_at: float | None = None
        self._learned_record: dict[str, Any] | None = learned_from_record(
            learning.calibration, enabled=learning.enabled)
        """The study's ``learned_from`` as this worker last wrote it (:meth:`_recalibrate`)."""
        self.repeated_errors = stop_early.RepeatedErrorRule(spec.search.stop_on_repeated_error)
        self.broken: stop_early.BrokenProgram | None = None

    def run(self, timeout_s: float | None, signals: StopSignals) -> RunSummary:
        started = time.monotonic()
        while True:
            if signals.received is not None:
                self.summary.stopped_by = (StopReason.SIGTERM if signals.received == signal.SIGTERM
                                           else StopReason.INTERRUPT)
                break
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                self.summary.stopped_by = StopReason.TIMEOUT
                break
            batch, stop = self._next_batch()
            if batch:
                with self.busy.measuring():  # until their records (and retry flags) are in
                    outcomes = self._measure(batch)
                lost = next((o for o in outcomes if o.node_lost), None)
                if lost is not None:
                    # The node group has a dead node for the rest of the allocation: leave
                    # the retries to the workers of healthy groups.
                    self.summary.stopped_by, self.summary.stop_reason = (StopReason.NODE_FAILURE,
                                                                         lost.reason)
                    self.progress.message(f"worker{self.name_suffix}: {lost.reason}; its "
                                          "node group is not used again")
                    break
                if self.broken is not None:
                    self.summary.stopped_by = StopReason.BROKEN_PROGRAM
                    self.summary.stop_reason = self.broken.message()
                    record = self.broken.record(stop_early.study_file_digest(self.spec))
                    set_user_attrs(self.study, {stop_early.BROKEN_PROGRAM_ATTR: record})
                    break
                continue
            if stop in (StopReason.BUDGET, StopReason.EXHAUSTED) and self.busy.others():
                # A side-by-side trial still runs: if it is cut short (a node dies under
                # it), its layout waits for a retry, and it must not be left without a
                # worker.
                time.sleep(_SIBLING_POLL_S)
                continue
            self.summary.stopped_by = stop or StopReason.EXHAUSTED
            break
        # One read of the study for the end: the calibration's last refit (the record holds
        # the last trial too), the best trial and the closing table.
        trials = self.store.history(states=None, keys=SUMMARY_KEYS)
        self._recalibrate(observations([t for t in trials if t.state in FINISHED], {}),
                          final=True)
        self.summary.best = self._retrying(lambda: whole(self.storage, highest(trials)))
        self.summary.trials = trials
        return self.summary

    def _next_batch(self) -> tuple[list[tuple[Claim, Layout]], StopReason | None]:
        """Up to ``batch_size`` claimed layouts (their trials created with the claims); with
        none, why this worker stops. A stop met once some are claimed waits for their
        results (the strategy decides again on them; the budget is met again at once)."""
        batch: list[tuple[Claim, Layout]] = []
        idle = 0
        # Retries (an interrupted batch's members) are claimed, still to measure: one launch.
        waiting = len(self.store.retry_keys())
        left = self.n_trials - len(self._claimed_keys()) + waiting
        size = max(1, min(self.batch_size, -(-left // self.siblings)))
        while len(batch) < size:
            step = self._retrying(self._step)
            if isinstance(step, str):
                return batch, step
            if step is None:
                idle += 1
                if idle > _MAX_IDLE_PROPOSALS:
                    return batch, StopReason.EXHAUSTED
                continue
            idle = 0
            if batch and step[1].world_size != batch[0][1].world_size:  # never in one study
                self._measure([step])
                continue
            batch.append(step)
        return batch, None

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
        of a study reading it all again for each layout one of them won (issue 23). A
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
            facts = self._facts(layout, trial_id=0, number=0, outcome=None, t0=utcnow(),
                                elapsed_s=0.0, result=None, hosts=[], paths=None, cand=cand)
            attrs = {TrialAttr.LAYOUT: layout.key(), TrialAttr.LAYOUT_DICT: layout.to_dict(),
                     TrialAttr.WORKER: self.name, TrialAttr.LAUNCHER: self.launcher.kind}
            requests.append(ClaimRequest(layout.key(), layout_params(layout, self.spec),
                                         attrs, self._row(facts)))
        return self.store.claim(requests, n_trials=self.n_trials, worker=self.name,
                                retry_only=retry_only,
                                before_commit=lambda: _test_kill_point("in-claim"))

    def _claimed_keys(self) -> dict[str, int]:
        """The study's claimed layouts, read incrementally (new claims only)."""
        for claim_id, key, trial_id in self._retrying(
                lambda: self.storage.claims_since(self.spec.name, self._last_claim_id)):
            self._claims[key] = trial_id
            self._last_claim_id = max(self._last_claim_id, claim_id)
        return self._claims

    def _retrying(self, fn: Callable[[], T]) -> T:
        return self.storage.retrying(f"worker {self.name}", fn)

    def _set_candidates(self, candidates: list[Candidate]) -> None:
        self.plan = plan_order(c.layout for c in candidates)
        self.by_key: dict[str, Candidate] = {c.layout.key(): c for c in candidates}

    def _recalibrate(self, observed: list[Observation], *, final: bool = False) -> None:
        """Refit the corrections when the study has judged more trials (one query); every
        untried layout gets its new probability of fitting, given the OOMs.

        After every trial up to 20, then whenever the judged trials grew by 5%, and at the
        end of the run: a refit costs a query and a grid posterior per ZeRO stage, which
        64 workers paying after every trial of a 200-trial study made the loop CPU-bound
        (issue #17), and the 201st point moves a posterior of 200 little."""
        judged = sum(o.status in ("ok", "oom") for o in observed)
        if judged == self._judged:
            return
        if (not final and self._judged is not None and self._judged >= 20
                and judged < self._judged * 1.05):
            return
        self._judged = judged
        ooms = [o.layout for o in observed if o.status == "oom"]
        self._set_candidates(self.learning.refit(self.storage, ooms))
        self.constraints = self.learning.constraints
        if getattr(self.launcher, "build_s", None) is None:
            self._build_s = build_seconds(None, (
                t.user_attrs.get(TrialAttr.TIMINGS_S) or {}
                for t in self.study.get_trials(deepcopy=False)))
        record = learned_from_record(self.learning.calibration, enabled=self.learning.enabled)
        if final or record != self._learned_record:  # a write less per refit changing nothing
            set_user_attrs(self.study, {StudyAttr.LEARNED_FROM: record})
            self._learned_record = record

    def _measure(self, batch: list[tuple[Claim, Layout]]) -> list[Verdict]:
        """Measure the claimed layouts in one launch; record each on its own, in one
        transaction, while every member's lease is still renewed."""
        spec = self.spec
        # The early stop's bar; without an early stop nothing reads it (one query less).
        best = (self.store.best_judged()
                if spec.trial.early_stop_tolerance is not None else None)
        run_cfg = spec.run_config(best.value if best is not None and best.value else None)
        specs, paths, cands = [], [], []
        _test_kill_point("after-claim")
        for claimed, layout in batch:
            key = layout.key()
            cand = self.by_key.get(key)
            paths.append(TrialPaths.for_trial(spec.launcher.run_dir, spec.name,
                                              claimed.number, key))
            specs.append(TrialSpec(model=spec.model, layout=layout, run=run_cfg))
            cands.append(cand)
        self.progress.launch_started([(c.number, lay, cand.predicted_tflops if cand else None)
                                      for (c, lay), cand in zip(batch, cands, strict=True)])
        t0 = utcnow()
        outcomes: list[Verdict] = []
        self.launcher.clear_abandoned()
        with ExitStack() as beats:
            for claimed, _ in batch:
                beats.enter_context(heartbeat(self.storage, claimed.trial_id,
                                              lease=claimed.lease, on_lost=self._lease_lost))
            reports = self.launcher.run_batch(specs, paths, timeout_s=spec.trial.timeout_s)
            _test_kill_point("after-launch")
            finished = utcnow()
            for (claimed, layout), report, cand, trial_paths in zip(batch, reports, cands,
                                                                   paths, strict=True):
                outcome = classify(report, self.launcher.workload.oom_signatures)
                facts = self._facts(layout, trial_id=claimed.trial_id, number=claimed.number,
                                    outcome=outcome, t0=t0, finished=finished,
                                    elapsed_s=report.elapsed_s, result=report.result,
                                    hosts=report.hosts, paths=trial_paths, cand=cand,
                                    batch=report.batch)
                self._record(claimed, layout, outcome, facts)
                outcomes.append(outcome)
        return outcomes

    def _lease_lost(self, lease: Lease) -> None:
        """A trial's lease is lost: its launch is killed, the layout left to its holder."""
        self.progress.message(f"{lease.lost}: its launch is cancelled")
        self.launcher.abandon()

    def _record_recovered(self, claimed: Claim, layout: Layout) -> bool:
        """Record the finished result the cut-short execution this retry takes over left
        (:mod:`autotune.runner.recovered`) instead of launching the layout again."""
        retry_of = self._retrying(lambda: self.storage.optuna.get_trial(
            claimed.trial_id)).user_attrs.get(TrialAttr.RETRY_OF)
        found = finished_result(self.spec.launcher.run_dir, self.spec.name, layout, retry_of)
        if found is None:
            return False
        res = found.result
        report = LaunchReport(result=res, returncode=None, elapsed_s=res.elapsed_s or 0.0,
                              hosts=list(res.hosts), workload=self.launcher.workload.kind,
                              batch={"index": res.batch_index or 0, "size": res.batch_size or 1,
                                     "lead": None, "rerun": False,
                                     "recovered_from": found.number})
        outcome = classify(report, self.launcher.workload.oom_signatures)
        self.progress.message(f"trial {claimed.number} ({layout.key()}): the result trial "
                              f"{found.number} wrote before its runner died is recorded; "
                              "not measured again")
        self._record(claimed, layout, outcome, self._facts(
            layout, trial_id=claimed.trial_id, number=claimed.number, outcome=outcome,
            t0=utcnow(), elapsed_s=report.elapsed_s, result=report.result,
            hosts=report.hosts, paths=found.paths, cand=self.by_key.get(layout.key()),
            batch=report.batch))
        return True

    def _record(self, claimed: Claim, layout: Layout, outcome: Verdict,
                facts: TrialFacts) -> None:
        recorded = self.store.record(claimed, outcome, result=facts.result,
                                     user_attrs=user_attrs(facts), measurement=self._row(facts),
                                     before_commit=lambda: _test_kill_point("in-record"))
        if not recorded:
            self.progress.message(f"trial {claimed.number} ({layout.key()}) was repaired as "
                                  "killed while it ran (its runner was silent for longer "
                                  "than storage.grace_period_s): its result is not recorded")
            return  # no value line either: the study holds no such value (issue 23)
        self.summary.measured += 1
        if outcome.retry:
            self._repaired_at = None  # its retry comes before anything new, as it always did
        self.broken = self.repeated_errors.observe(outcome.kind, stop_early.failure_of(
            outcome, number=claimed.number, layout=layout.key(), trial_dir=facts.trial_dir)) \
            or self.broken
        self.progress.trial_finished(claimed.number, layout, outcome,
                                     self.store.best()
                                     if self.progress.enabled else None)

    def _facts(self, layout: Layout, *, trial_id: int, number: int, outcome: Verdict | None,
               t0: datetime, elapsed_s: float, result: TrialResult | None, hosts: list[str],
               paths: TrialPaths | None, cand: Candidate | None,
               finished: datetime | None = None,
               batch: dict[str, Any] | None = None) -> TrialFacts:
        return TrialFacts(
            study_name=self.spec.name, trial_number=number, trial_id=trial_id,
            layout=layout, outcome=outcome, result=result, launcher=self.launcher.kind,
            worker=self.name, started_at=t0, finished_at=finished or utcnow(),
            elapsed_s=elapsed_s, hosts=hosts,
            predicted_tflops_per_device=cand.predicted_tflops if cand else None,
            predicted_memory_bytes=cand.predicted_memory_bytes if cand else None,
            trial_dir=str(paths.root) if paths else None,
            calibrated_tflops_per_device=cand.predicted_tflops
            * self.learning.calibration.throughput_factor if cand else None,
            calibrated_memory_bytes=self.learning.calibrated_memory_bytes(layout),
            batch=batch)

    def _row(self, facts: TrialFacts) -> dict[str, Any]:
        spec = self.spec
        return measurement_row(facts, model=spec.model, cluster=spec.cluster,
                               global_batch=spec.training.global_batch,
                               dtype=spec.training.dtype, workload=self.learning.key.workload)


TEST_KILL_ENV = "AUTOTUNE_TEST_KILL_AT"
"""A test hook, not a setting: ``after-claim`` (between the claim and the launch),
``after-launch`` (the trial ran, nothing recorded), ``in-claim`` (inside the claim's
transaction, its locks held, before its commit) or ``in-record`` (inside the record's
transaction, before its commit) makes the runner SIGKILL itself there, so that the
fault-injection tests (tests/runner/test_kills.py, tests/faults/) hit those instants
exactly."""

TEST_STOP_ENV = "AUTOTUNE_TEST_STOP_AT"
"""The same instants, with SIGSTOP instead, once per process: a worker frozen there (a
node swapping, a suspended job) until the test sends it SIGCONT (tests/faults/)."""

_stopped_once: set[str] = set()


def _test_kill_point(point: str) -> None:
    if os.environ.get(TEST_KILL_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(TEST_STOP_ENV) == point and point not in _stopped_once:
        _stopped_once.add(point)
        os.kill(os.getpid(), signal.SIGSTOP)
