"""The study runner: propose a layout, check it, measure it, record it; resume anywhere.

One worker runs :func:`run_study`. Many workers may run it on the same study and database
at once: a unique layout claim (:meth:`autotune.storage.db.Storage.claim`) keeps every
layout measured once, and the claim order enforces the trial budget exactly.

The loop uses Optuna's ask-and-tell interface rather than ``study.optimize`` because a
trial here is an external process whose interruption must be handled precisely:

* every proposal comes from the search strategy (:mod:`autotune.search`) and is enqueued
  with per-axis parameters, so optuna-dashboard shows (tp, pp, micro_batch, ...);
* an infeasible proposal (or one needing no less memory than a measured OOM) is told as
  PRUNED with a violated constraint, never launched;
* a heartbeat thread marks the running trial alive; a runner killed with SIGKILL leaves
  a trial that the next run's :func:`optuna.storages.fail_stale_trials` fails, and
  :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` re-enqueues its layout;
* Ctrl-C or SIGTERM cancels the launcher (the trial's whole process group dies), the
  trial is failed as ``interrupted`` and re-enqueued, and the database stays consistent;
* a strategy that stops early (``search.min_improvement``) ends this worker's run; its
  reason is stored as the study's ``search_stop`` user attribute (``autotune status``
  shows it) and cleared when a later proposal is made. The decision is a function of the
  history alone, so a resumed run reaches it again at once;
* layouts are measured in batches of ``trial.batch_size`` per launch (they share the
  study's world size): the worker asks, checks and claims every member before the launch,
  beats for each while it runs, and tells each result on its own
  (:meth:`autotune.launchers.base.Launcher.run_batch` has what a crash inside a batch
  does); the early stop's bar is the study's best when the batch is launched.

Strategies get the candidates in plan order (:func:`autotune.search.plan_order`), the
order the benchmark replays them in, whatever the cost model predicts of them, with the
cost model's prediction and each candidate's probability of fitting apart. Whenever the
study has judged more trials, the worker refits its memory and step-time corrections
(:mod:`autotune.runner.learning`, warm-started from earlier studies of the device) and
recomputes every candidate's probability of fitting, conditioned on the study's OOMs. How
each step reads and writes the Optuna study is :mod:`autotune.runner.optuna_io`; when a
study is done, :mod:`autotune.runner.budget`.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.candidates import Candidate
from autotune.errors import UsageError
from autotune.feasibility import Constraints, Reason
from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.results import best_trial
from autotune.runner.budget import budget_reached, within_budget
from autotune.runner.learning import StudyLearning, earlier_rows, key_of, workload_of
from autotune.runner.lifecycle import Busy, StopSignals, heartbeat
from autotune.runner.optuna_io import (
    enqueue,
    history,
    is_retry,
    open_study,
    retryable,
    set_search_stop,
    suggest,
    tell_infeasible,
    tell_outcome,
    tell_skipped,
)
from autotune.runner.outcome import Outcome, classify, infeasible
from autotune.runner.progress import Progress
from autotune.runner.records import (
    StudyAttr,
    TrialFacts,
    learned_from_line,
    learned_from_record,
    measurement_row,
    search_stop_of,
    search_stop_record,
    set_user_attrs,
)
from autotune.search import (
    Observation,
    cost_model_predictor,
    dominated_by_oom,
    make_strategy,
    plan_order,
)
from autotune.spec import StudySpec
from autotune.storage.db import ClaimResult, Storage
from autotune.trial import TrialPaths, TrialSpec

__all__ = ["RunSummary", "run_study"]

_MAX_IDLE_PROPOSALS = 200
_SIBLING_POLL_S = 0.5


@dataclass
class RunSummary:
    measured: int = 0
    """Trials this worker launched."""
    infeasible: int = 0
    stopped_by: str = "budget"
    """``budget``, ``timeout``, ``exhausted``, ``strategy`` (it stopped early: see
    ``stop_reason``), ``interrupt``, ``sigterm`` or ``node_failure`` (a node of this
    worker's group died; ``stop_reason`` says which; with several groups, only when every
    group lost one)."""
    stop_reason: str | None = None
    """With ``strategy``: the strategy's reason, e.g. ``expected improvement 0.31% < 1%
    after 6 trials (14 layouts untried)``."""
    best: FrozenTrial | None = None
    trials: list[FrozenTrial] = field(default_factory=list)


class Admission(Enum):
    """What becomes of an asked trial before anything is launched."""

    LAUNCH = "launch"
    """Feasible, claimed and within the budget: measure it."""
    PASSED = "passed"
    """Told infeasible or skipped, or another worker runs it: ask again."""
    BUDGET = "budget"
    """The budget was reached meanwhile (another worker's claim came first): stop."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def run_study(spec: StudySpec, storage: Storage, launchers: Launcher | Sequence[Launcher], *,
              n_trials: int | None = None, timeout_s: float | None = None,
              progress: Progress | None = None) -> RunSummary:
    """Run this worker's share of the study until the budget, the timeout or a signal.

    With several launchers (disjoint node groups of one allocation: see
    :func:`autotune.launchers.make_launchers`) one worker thread drives each, side by
    side; the layout claims keep them from measuring anything twice.
    """
    launchers = [launchers] if isinstance(launchers, Launcher) else list(launchers)
    with warnings.catch_warnings():
        # ask/tell with heartbeats and stale-trial failing is deliberate (module docstring);
        # Optuna warns that heartbeats "are supposed to be used with Study.optimize".
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _run(spec, storage, launchers, n_trials=n_trials, timeout_s=timeout_s,
                    progress=progress)


def _run(spec: StudySpec, storage: Storage, launchers: list[Launcher], *,
         n_trials: int | None, timeout_s: float | None,
         progress: Progress | None) -> RunSummary:
    n_trials = n_trials or spec.search.n_trials
    constraints = Constraints.from_configs(spec.cluster, spec.training, spec.search, spec.trial,
                                           profile=spec.profile)
    table = launchers[0].fixed_layouts()
    if table is not None:
        # A replayed table is the space: its rows say what ran and what ran out of memory,
        # so only the structural rules apply (the study's axes, placement and memory
        # model would hide rows that were measured).
        constraints = constraints.structural_only()
    key = key_of(spec, workload_of(launchers[0].kind))
    learn = spec.search.learn_from_database
    learning = StudyLearning(spec, constraints, key,
                             earlier_rows(storage, key, spec.name) if learn else (),
                             table=table, enabled=learn)
    candidates = learning.candidates()
    if not candidates:
        raise UsageError(f"{spec.source or spec.name}: no feasible layout in the search space;"
                         f" run `autotune plan {spec.source or 'STUDY'}` to see why")
    study = open_study(spec, storage)  # once, before worker threads could race to create it
    record = learned_from_record(learning.calibration, enabled=learn)
    set_user_attrs(study, {StudyAttr.LEARNED_FROM: record})
    progress = progress or Progress(total=n_trials, enabled=False)
    progress.message(f"calibration: {learned_from_line(record)}")
    timeout_s = timeout_s if timeout_s is not None else spec.search.timeout_s
    busy = Busy()
    workers = [_Worker(spec, storage, study, launcher, learning.copy(), n_trials,
                       progress, name_suffix=f"/{i}" if len(launchers) > 1 else "",
                       siblings=len(launchers), busy=busy)
               for i, launcher in enumerate(launchers)]
    with StopSignals(launchers) as signals:
        if len(workers) == 1:
            return workers[0].run(timeout_s, signals)
        errors: list[BaseException] = []

        def drive(worker: _Worker) -> None:
            try:
                worker.run(timeout_s, signals)
            except BaseException as err:  # re-raised in the main thread below
                errors.append(err)
                signals.stop()

        threads = [threading.Thread(target=drive, args=(w,), name=f"worker{w.name_suffix}")
                   for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # join in slices so that the main thread takes signals
                t.join(timeout=0.5)
        if errors:
            raise errors[0]
    summaries = [w.summary for w in workers]
    ended = next((s for s in summaries if s.stopped_by in ("interrupt", "sigterm")),
                 next((s for s in summaries if s.stopped_by != "node_failure"), summaries[0]))
    return RunSummary(measured=sum(s.measured for s in summaries),
                      infeasible=sum(s.infeasible for s in summaries),
                      stopped_by=ended.stopped_by, stop_reason=ended.stop_reason,
                      best=best_trial(study), trials=study.get_trials(deepcopy=False))


class _Worker:
    """One worker's loop over the shared study (see the module docstring)."""

    def __init__(self, spec: StudySpec, storage: Storage, study: optuna.Study,
                 launcher: Launcher, learning: StudyLearning, n_trials: int,
                 progress: Progress, *, name_suffix: str = "", siblings: int = 1,
                 busy: Busy | None = None) -> None:
        self.spec, self.storage, self.launcher = spec, storage, launcher
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
            predict=cost_model_predictor(spec.model, spec.cluster, dtype=spec.training.dtype,
                                         profile=spec.profile),
            p_fit=lambda lay: self.by_key[lay.key()].p_fit if lay.key() in self.by_key
            else 0.0,
            min_improvement=spec.search.min_improvement,
            warm_start=learning.calibration.residuals)
        self.name_suffix = name_suffix
        self.name = f"{socket.gethostname()}:{os.getpid()}{name_suffix}"
        self.batch_size = spec.trial.batch_size if launcher.batches else 1
        self.summary = RunSummary()
        self.busy = busy or Busy()

    def run(self, timeout_s: float | None, signals: StopSignals) -> RunSummary:
        started = time.monotonic()
        while True:
            if signals.received is not None:
                self.summary.stopped_by = ("sigterm" if signals.received == signal.SIGTERM
                                           else "interrupt")
                break
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                self.summary.stopped_by = "timeout"
                break
            batch, stop = self._next_batch()
            if batch:
                with self.busy.measuring():  # until its retries, if any, are enqueued
                    outcomes = self._measure(batch)
                lost = next((o for o in outcomes if o.node_lost), None)
                if lost is not None:
                    # The node group has a dead node for the rest of the allocation: leave
                    # the retries to the workers of healthy groups.
                    self.summary.stopped_by, self.summary.stop_reason = ("node_failure",
                                                                         lost.reason)
                    self.progress.message(f"worker{self.name_suffix}: {lost.reason}; its "
                                          "node group is not used again")
                    break
                continue
            if stop in ("budget", "exhausted") and self.busy.others():
                # A side-by-side trial still runs: if it is cut short (a node dies under
                # it), its retry is enqueued, and it must not be left without a worker.
                time.sleep(_SIBLING_POLL_S)
                continue
            if stop:
                self.summary.stopped_by = stop
                break
        self._recalibrate(history(self.study, {}))  # the record holds the last trial too
        self.summary.best = best_trial(self.study)
        self.summary.trials = self.study.get_trials(deepcopy=False)
        return self.summary

    def _next_batch(self) -> tuple[list[tuple[optuna.Trial, Layout]], str | None]:
        """Up to ``batch_size`` admitted (checked, claimed, budgeted) trials; with none, why
        this worker stops. A stop met once some are admitted waits for their results
        (the strategy decides again on them; the budget is met again at once)."""
        batch: list[tuple[optuna.Trial, Layout]] = []
        idle = 0
        left = self.n_trials - len(self.storage.claimed_keys(self.spec.name))
        size = max(1, min(self.batch_size, -(-left // self.siblings)))
        while len(batch) < size:
            stop = self._enqueue_next()
            if stop:
                return batch, stop
            trial = self.study.ask()
            try:
                admission, layout = self._admit(trial)
            except optuna.exceptions.UpdateFinishedTrialError:
                # SQLite can hand one waiting trial to two workers; the other one has it
                # (and its layout claim). Leave it alone.
                continue
            if admission is Admission.BUDGET:
                return batch, "budget"
            if admission is Admission.PASSED:
                idle += 1
                if idle > _MAX_IDLE_PROPOSALS:
                    return batch, "exhausted"
                continue
            idle = 0
            if batch and layout.world_size != batch[0][1].world_size:  # never in one study
                self._measure([(trial, layout)])
                continue
            batch.append((trial, layout))
        return batch, None

    def _enqueue_next(self) -> str | None:
        """Enqueue the strategy's next layout unless a retry waits; a stop reason if none."""
        optuna.storages.fail_stale_trials(self.study)
        claimed = self.storage.claimed_keys(self.spec.name)
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return None
        if budget_reached(len(claimed), self.n_trials):
            return "budget"
        observed = history(self.study, claimed)
        self._recalibrate(observed)
        proposal = self.strategy.propose(self.plan, observed)
        stop = self.strategy.stop
        if proposal is None and stop is not None:
            self.summary.stop_reason = stop.reason
            set_search_stop(self.study, search_stop_record(
                stop.reason, judged=stop.judged, strategy=self.strategy.name,
                min_improvement=self.spec.search.min_improvement, worker=self.name,
                at=_utcnow()))
            return "strategy"
        if proposal is None:
            return "exhausted"
        if search_stop_of(self.study) is not None:
            # An earlier stop no longer holds (another threshold, or new measurements).
            set_search_stop(self.study, None)
        enqueue(self.study, proposal)
        return None

    def _set_candidates(self, candidates: list[Candidate]) -> None:
        self.plan = plan_order(c.layout for c in candidates)
        self.by_key: dict[str, Candidate] = {c.layout.key(): c for c in candidates}

    def _recalibrate(self, observed: list[Observation]) -> None:
        """Refit the corrections when the study has judged more trials (one query); every
        untried layout gets its new probability of fitting, given the OOMs."""
        judged = sum(o.status in ("ok", "oom") for o in observed)
        if judged == self._judged:
            return
        self._judged = judged
        ooms = [o.layout for o in observed if o.status == "oom"]
        self._set_candidates(self.learning.refit(self.storage, ooms))
        self.constraints = self.learning.constraints
        set_user_attrs(self.study, {StudyAttr.LEARNED_FROM: learned_from_record(
            self.learning.calibration, enabled=self.learning.enabled)})

    def _admit(self, trial: optuna.Trial) -> tuple[Admission, Layout]:
        """Check, claim and budget the trial's layout (and tell the trial if it is not
        launched)."""
        layout = suggest(trial, self.spec)
        key = layout.key()
        reasons = self.constraints.check(layout, self.spec.model)
        oom = dominated_by_oom(layout, history(self.study, {}))
        if oom is not None:
            reasons.append(Reason("oom_dominated", f"needs at least the memory of "
                                  f"{oom.key()}, which ran out of memory"))
        if reasons:
            tell_infeasible(self.study, trial, layout, infeasible(reasons), self.name)
            self.summary.infeasible += 1
            return Admission.PASSED, layout
        claim = self.storage.claim(self.spec.name, key, trial._trial_id, self.name,
                                   may_take_over=lambda owner: retryable(self.study, owner))
        if claim is ClaimResult.OTHER_WORKER:
            return Admission.PASSED, layout  # the same trial was handed to another worker
        if claim is ClaimResult.TAKEN:
            tell_skipped(self.study, trial, layout, "another trial owns this layout")
            return Admission.PASSED, layout
        rank = self.storage.claim_rank(self.spec.name, key)
        if not within_budget(rank, self.n_trials) and not is_retry(self.study, trial):
            self.storage.release(self.spec.name, key, trial._trial_id)
            tell_skipped(self.study, trial, layout, "the trial budget was reached")
            return Admission.BUDGET, layout
        return Admission.LAUNCH, layout

    def _measure(self, batch: list[tuple[optuna.Trial, Layout]]) -> list[Outcome]:
        """Measure the admitted trials in one launch; record and tell each on its own."""
        spec = self.spec
        best = best_trial(self.study)
        run_cfg = spec.run_config(best.value if best is not None and best.value else None)
        specs, paths, cands = [], [], []
        for trial, layout in batch:
            key = layout.key()
            cand = self.by_key.get(key)
            paths.append(TrialPaths.for_trial(spec.launcher.run_dir, spec.name, trial.number,
                                              key))
            specs.append(TrialSpec(model=spec.model, layout=layout, run=run_cfg))
            cands.append(cand)
            self.progress.trial_started(trial.number, layout,
                                        cand.predicted_tflops if cand else None)
        t0 = _utcnow()
        with ExitStack() as beats:
            for trial, _ in batch:
                beats.enter_context(heartbeat(self.storage, trial._trial_id))
            reports = self.launcher.run_batch(specs, paths, timeout_s=spec.trial.timeout_s)
        finished = _utcnow()
        outcomes: list[Outcome] = []
        for (trial, layout), report, cand, trial_paths in zip(batch, reports, cands, paths,
                                                             strict=True):
            outcome = classify(report)
            facts = TrialFacts(
                study_name=spec.name, trial_number=trial.number, trial_id=trial._trial_id,
                layout=layout, outcome=outcome, result=report.result,
                launcher=self.launcher.kind, worker=self.name, started_at=t0,
                finished_at=finished, elapsed_s=report.elapsed_s, hosts=report.hosts,
                predicted_tflops_per_device=cand.predicted_tflops if cand else None,
                predicted_memory_bytes=cand.predicted_memory_bytes if cand else None,
                trial_dir=str(trial_paths.root),
                calibrated_tflops_per_device=cand.predicted_tflops
                * self.learning.calibration.throughput_factor if cand else None,
                calibrated_memory_bytes=self.learning.calibrated_memory_bytes(layout),
                batch=report.batch)
            self.storage.add_measurement(measurement_row(
                facts, model=spec.model, cluster=spec.cluster,
                global_batch=spec.training.global_batch, dtype=spec.training.dtype,
                workload=self.learning.key.workload))
            tell_outcome(self.study, trial, facts)
            if outcome.retry:
                enqueue(self.study, layout, retry_of=trial.number)
            self.summary.measured += 1
            self.progress.trial_finished(trial.number, layout, outcome, best_trial(self.study))
            outcomes.append(outcome)
        return outcomes
