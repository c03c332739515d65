"""One worker's loop over a shared study (:mod:`autotune.runner.study` runs the workers;
its docstring has what the loop guarantees): repair, retries first, propose, admit, claim,
measure, record. Also the fault-injection tests' kill and stop points (a test hook)."""


from __future__ import annotations

import os
import signal
import socket
import time
from contextlib import ExitStack
from typing import Any, TypeVar

import optuna

from autotune.feasibility import Constraints
from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.models.prediction_spread import scale_sd
from autotune.planning.candidates import Candidate
from autotune.runner import stop_early
from autotune.runner.confirm_rotation import rotates
from autotune.runner.facts import FactsBuilder
from autotune.runner.kill_points import TEST_KILL_ENV, TEST_STOP_ENV, test_kill_point
from autotune.runner.learning import (
    StudyLearning,
    build_seconds,
    trial_seconds,
)
from autotune.runner.lifecycle import Busy, StopSignals, heartbeat
from autotune.runner.optuna_io import observations
from autotune.runner.progress import Progress
from autotune.runner.proposing import Proposing
from autotune.runner.recovered import finished_result, recovered_report
from autotune.runner.summary import RunSummary
from autotune.search import (
    Observation,
    cost_model_predictor,
    make_strategy,
    plan_order,
)
from autotune.spec import StudySpec
from autotune.storage import (
    FINISHED,
    SUMMARY_KEYS,
    Claim,
    Lease,
    Storage,
    StudyAttr,
    TrialAttr,
    TrialFacts,
    TrialStore,
    highest,
    learned_from_record,
    set_user_attrs,
    user_attrs,
    utcnow,
    whole,
)
from autotune.trial import TrialPaths, TrialSpec
from autotune.trial.classify import classify, storable
from autotune.trial.outcome import StopReason, Verdict

T = TypeVar("T")

__all__ = ["RunSummary", "Worker", "TEST_KILL_ENV", "TEST_STOP_ENV"]

_MAX_IDLE_PROPOSALS = 200
_SIBLING_POLL_S = 0.5


class Worker(Proposing):
    """One worker's loop over the shared study (see the module docstring)."""

    def __init__(self, spec: StudySpec, storage: Storage, study: optuna.Study,
                 launcher: Launcher, learning: StudyLearning, n_trials: int,
                 progress: Progress, *, name_suffix: str = "", siblings: int = 1,
                 busy: Busy | None = None, holds_round: bool = False) -> None:
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
                stack=spec.training.stack,
                known={c.layout: c.predicted_tflops for c in self.by_key.values()}),
            p_fit=lambda lay: self.by_key[lay.key()].p_fit if lay.key() in self.by_key
            else 0.0,
            min_improvement=spec.search.min_improvement,
            warm_start=learning.calibration.residuals,
            scale_sd=scale_sd(spec.cluster.device),
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
        self._builder = FactsBuilder(spec, launcher.kind, self.name, learning)
        self.repeated_errors = stop_early.RepeatedErrorRule(spec.search.stop_on_repeated_error)
        self.holds_round = holds_round and spec.search.confirm >= 2 and \
            spec.search.objective == "throughput" and rotates(launcher)
        """Whether the study's last batch is launched held (:mod:`autotune.launchers.
        held`): the worker whose launcher the confirmation round uses, when the round
        would rotate the built-in trainer's engines in one launch."""
        self._last_batch = False
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
        self._last_batch = False
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
        # It takes what is left of the budget: the study's last launch, which the
        # confirmation round may reuse (Worker.holds_round).
        self._last_batch = len(batch) >= left
        return batch, None

    def _set_candidates(self, candidates: list[Candidate]) -> None:
        self.plan = plan_order(c.layout for c in candidates)
        self.by_key: dict[str, Candidate] = {c.layout.key(): c for c in candidates}

    def _recalibrate(self, observed: list[Observation], *, final: bool = False) -> None:
        """Refit the corrections when the study has judged more trials (one query); every
        untried layout gets its new probability of fitting, given the OOMs and the runs.

        After every trial up to 20, then whenever the judged trials grew by 5%, and at the
        end of the run: a refit costs a query and a grid posterior per ZeRO stage, which,
        paid by every worker after every trial, makes a study of many workers CPU-bound;
        and the 201st point moves a posterior of 200 little."""
        judged = sum(o.status in ("ok", "oom") for o in observed)
        if judged == self._judged:
            return
        if (not final and self._judged is not None and self._judged >= 20
                and judged < self._judged * 1.05):
            return
        self._judged = judged
        ooms = [o.layout for o in observed if o.status == "oom"]
        fits = [o.layout for o in observed if o.status == "ok"]
        self._set_candidates(self.learning.refit(self.storage, ooms, fits))
        self.constraints = self.learning.constraints
        if getattr(self.launcher, "build_s", None) is None:
            # One narrow read of the timings, not the study's whole trials each refit.
            self._build_s = build_seconds(None, (
                t.user_attrs.get(TrialAttr.TIMINGS_S) or {}
                for t in self.store.history(states=None, keys=(TrialAttr.TIMINGS_S,))))
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
        test_kill_point("after-claim")
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
            hold = self.holds_round and self._last_batch
            reports = (self.launcher.run_batch(specs, paths, timeout_s=spec.trial.timeout_s,
                                               hold=True) if hold else
                       self.launcher.run_batch(specs, paths, timeout_s=spec.trial.timeout_s))
            test_kill_point("after-launch")
            finished = utcnow()
            for (claimed, layout), report, cand, trial_paths in zip(batch, reports, cands,
                                                                   paths, strict=True):
                report = storable(report)  # what is recorded: a storable result, or none
                outcome = classify(report, self.launcher.workload.oom_signatures)
                facts = self._builder.facts(
                    layout, trial_id=claimed.trial_id, number=claimed.number,
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
        report = storable(recovered_report(found, self.launcher.workload.kind))
        outcome = classify(report, self.launcher.workload.oom_signatures)
        self.progress.message(f"trial {claimed.number} ({layout.key()}): the result trial "
                              f"{found.number} wrote before its runner died is recorded; "
                              "not measured again")
        self._record(claimed, layout, outcome, self._builder.facts(
            layout, trial_id=claimed.trial_id, number=claimed.number, outcome=outcome,
            t0=utcnow(), elapsed_s=report.elapsed_s, result=report.result,
            hosts=report.hosts, paths=found.paths, cand=self.by_key.get(layout.key()),
            batch=report.batch))
        return True

    def _record(self, claimed: Claim, layout: Layout, outcome: Verdict,
                facts: TrialFacts) -> None:
        recorded = self.store.record(claimed, outcome, result=facts.result,
                                     user_attrs=user_attrs(facts),
                                     measurement=self._builder.row(facts),
                                     before_commit=lambda: test_kill_point("in-record"))
        if not recorded:
            self.progress.message(f"trial {claimed.number} ({layout.key()}) was repaired as "
                                  "killed while it ran (its runner was silent for longer "
                                  "than storage.grace_period_s): its result is not recorded")
            return  # no value line either: the study holds no such value
        self.summary.measured += 1
        if outcome.retry:
            self._repaired_at = None  # its retry comes before anything new, as it always did
        self.broken = self.repeated_errors.observe(outcome.kind, stop_early.failure_of(
            outcome, number=claimed.number, layout=layout.key(), trial_dir=facts.trial_dir)) \
            or self.broken
        self.progress.trial_finished(claimed.number, layout, outcome,
                                     self.store.best()
                                     if self.progress.enabled else None)
