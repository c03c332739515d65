"""The study runner: propose a layout, check it, measure it, record it; resume anywhere.

This module runs a study (:func:`run_study`: workers side by side, node groups, the
confirmation round at the end); one worker's loop is :class:`autotune.runner.worker.Worker`.

One worker runs :func:`run_study`. Many workers may run it on the same study and database
at once: a unique layout claim (:func:`autotune.storage.claims.claim_layout`) keeps every
layout measured once, and the claims enforce the trial budget exactly.

The loop creates its trials itself rather than through ``study.optimize`` or ``ask``,
because a trial here is an external process whose interruption must be handled
precisely, and a kill at any instant must leave the study consistent:

* each step first repairs trials whose runner died (their claim's lease ran out:
  :func:`~autotune.storage.claims.repair_stale`), re-runs a layout whose execution was cut
  short (killed, interrupted) before anything new, and only then counts the budget;
* every proposal comes from the search strategy (:mod:`autotune.search`) and must be a
  candidate of the study's space; its trial is created with per-axis parameters (so
  optuna-dashboard shows tp, pp, micro_batch, ...) in the transaction that claims its
  layout and starts its lease; a lost claim race stores nothing;
* an infeasible proposal (or one needing no less memory than a measured OOM) is stored as
  PRUNED with a violated constraint, never launched;
* a heartbeat thread renews the lease while the trial runs and while its result is
  recorded, in one transaction (values, attributes, state, the ``measurements`` row);
* Ctrl-C or SIGTERM cancels the launcher (the trial's whole process tree dies), the
  trial is recorded as ``interrupted`` and its layout retried later;
* a strategy that stops early (``search.min_improvement``) ends this worker's run; its
  reason is stored as the study's ``search_stop`` user attribute (``autotune status``
  shows it) and cleared when a later proposal is made. The decision is a function of the
  history alone, so a resumed run reaches it again at once;
* layouts are measured in batches of ``trial.batch_size`` per launch (they share the
  study's world size): the worker checks and claims every member before the launch,
  renews every member's lease while it runs, and records each result on its own
  (:meth:`autotune.launchers.base.Launcher.run_batch` has what a crash inside a batch
  does); the early stop's bar is the study's best when the batch is launched. A retry
  whose cut-short execution had written its result (a member that finished before its
  runner was killed) records that result and is not launched
  (:mod:`autotune.runner.recovered`).

Strategies get the candidates in plan order (:func:`autotune.search.plan_order`), the
order the benchmark replays them in, whatever the cost model predicts of them, with the
cost model's prediction and each candidate's probability of fitting apart. Whenever the
study has judged more trials, the worker refits its memory and step-time corrections
(:mod:`autotune.runner.learning`, warm-started from earlier studies of the device) and
recomputes every candidate's probability of fitting, conditioned on the study's OOMs and
runs. How the Optuna study is opened and read is :mod:`autotune.runner.optuna_io`; how
trials are written, :mod:`autotune.storage.claims`; when a study is done,
:mod:`autotune.runner.budget`.
"""



from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Sequence
from typing import TypeVar

import optuna

from autotune.errors import EmptySpaceError, UsageError
from autotune.feasibility import Constraints
from autotune.launchers.base import Launcher
from autotune.planning.candidates import table_constraints
from autotune.planning.empty import empty_message
from autotune.runner import stop_early
from autotune.runner.confirm import confirm_best
from autotune.runner.learning import (
    StudyLearning,
    key_of,
    workload_of,
)
from autotune.runner.lifecycle import Busy, StopSignals
from autotune.runner.optuna_io import open_study
from autotune.runner.progress import Progress, judged_claims
from autotune.runner.verdict_note import publish_verdict
from autotune.runner.worker import RunSummary, Worker
from autotune.spec import StudySpec
from autotune.storage import (
    SUMMARY_KEYS,
    Storage,
    StudyAttr,
    highest,
    judged_trials,
    learned_from_line,
    learned_from_record,
    set_user_attrs,
    whole,
)
from autotune.trial.outcome import StopReason
from autotune.workloads.deepspeed_version import deepspeed_for_study

T = TypeVar("T")

__all__ = ["RunSummary", "run_study"]

def run_study(spec: StudySpec, storage: Storage, launchers: Launcher | Sequence[Launcher], *,
              n_trials: int | None = None, timeout_s: float | None = None,
              progress: Progress | None = None, retry_failed: bool = False) -> RunSummary:
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
                    progress=progress, retry_failed=retry_failed)


def _run(spec: StudySpec, storage: Storage, launchers: list[Launcher], *,
         n_trials: int | None, timeout_s: float | None,
         progress: Progress | None, retry_failed: bool = False) -> RunSummary:
    n_trials = n_trials or spec.search.n_trials
    constraints = Constraints.from_configs(
        spec.cluster, spec.training, spec.search, spec.trial, profile=spec.profile,
        deepspeed=deepspeed_for_study(spec.search, spec.workload, spec.launcher))
    table = launchers[0].fixed_layouts()
    if table is not None:  # a replayed table is the space, checked as plan checks it
        constraints = table_constraints(constraints, spec.launcher.replay)
    key = key_of(spec, workload_of(launchers[0].kind, spec.workload.kind))
    learn = spec.search.learn_from_database
    learning = StudyLearning.from_storage(storage, spec, constraints, key, learn=learn,
                                          table=table)
    candidates = learning.candidates()
    if not candidates:
        # the reasons under the calibration that emptied it (the uncalibrated check may
        # keep layouts the database's measured OOMs rule out)
        raise EmptySpaceError(empty_message(spec, learning.constraints, table))
    # once, before worker threads could race to create it
    study = storage.retrying("opening the study", lambda: open_study(spec, storage))
    refusal = stop_early.resume_refusal(study, spec, storage, retry_failed=retry_failed)
    if refusal is not None:
        raise UsageError(refusal)
    learning.refit(storage)  # a resume's header states the correction its study's trials give
    record = learned_from_record(learning.calibration, enabled=learn)
    set_user_attrs(study, {StudyAttr.LEARNED_FROM: record})
    progress = progress or Progress(total=n_trials, enabled=False)
    progress.resume(judged_claims(storage, spec.name))
    progress.message(f"calibration: {learned_from_line(record)}")
    measured_in = launchers[0].describe().get("dtype")  # a replayed table's
    if measured_in is not None and measured_in != spec.training.dtype:
        progress.message(f"note: the table was measured in {measured_in}; training.dtype "
                         f"{spec.training.dtype} predicts {spec.training.dtype}'s memory (write "
                         f"{measured_in} to predict the table's runs)")
    timeout_s = timeout_s if timeout_s is not None else spec.search.timeout_s
    # The wall-time limit covers the confirmation round too: it is part of the run.
    deadline = time.monotonic() + timeout_s if timeout_s is not None else None
    busy = Busy()
    workers = [Worker(spec, storage, study, launcher, learning.copy(), n_trials,
                       progress, name_suffix=f"/{i}" if len(launchers) > 1 else "",
                       siblings=len(launchers), busy=busy, holds_round=i == 0)
               for i, launcher in enumerate(launchers)]
    try:
        with StopSignals(launchers) as signals:
            summary = (workers[0].run(timeout_s, signals) if len(workers) == 1
                       else _run_side_by_side(workers, storage, study, timeout_s, signals))
            if summary.stopped_by in (StopReason.BUDGET, StopReason.STRATEGY,
                                      StopReason.EXHAUSTED):
                _confirm(spec, storage, study, launchers[0], summary, workers[0].name,
                         signals, progress, deadline)
    finally:
        # The last batch's launch, held for the round (autotune.launchers.held), ends
        # here whatever happened: used by the round, skipped, interrupted or failed.
        for launcher in launchers:
            launcher.release_held()
    return summary


def _confirm(spec: StudySpec, storage: Storage, study: optuna.Study, launcher: Launcher,
             summary: RunSummary, worker: str, signals: StopSignals,
             progress: Progress, deadline: float | None) -> None:
    """The study is done: its confirmation round (:mod:`autotune.runner.confirm`) names
    the best it reports. A round cut short (Ctrl-C, SIGTERM, the wall-time limit) ends the
    run as that, not as the budget reached: the best is then the single pass's,
    unconfirmed."""
    done = confirm_best(spec, storage, study, launcher, worker=worker, signals=signals,
                        say=progress.message, deadline=deadline)
    progress.message(done.line)
    if done.record is not None:  # the verdict where a person reads it (dashboard, attrs)
        storage.retrying("storing the verdict", lambda: publish_verdict(study, done.line))
    if done.ended is not None:
        summary.stopped_by = {"interrupt": StopReason.CONFIRM_INTERRUPT,
                              "timeout": StopReason.CONFIRM_TIMEOUT}.get(
                                  done.ended, StopReason(done.ended))
    summary.confirmation = done.record
    winner = (done.record or {}).get("winner_trial")
    summary.trials = judged_trials(storage, study.study_name, states=None, keys=SUMMARY_KEYS)
    if winner is not None:
        summary.best = next((whole(storage, t) for t in summary.trials if t.number == winner),
                            summary.best)


def _run_side_by_side(workers: list[Worker], storage: Storage, study: optuna.Study,
                      timeout_s: float | None,
                      signals: StopSignals) -> RunSummary:
    """One thread per worker (node group); their summaries as one."""
    errors: list[BaseException] = []

    def drive(worker: Worker) -> None:
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
    # Read once more after all of them ended: each one read the study at its own end.
    trials = judged_trials(storage, study.study_name, states=None, keys=SUMMARY_KEYS)
    signalled = (StopReason.INTERRUPT, StopReason.SIGTERM)
    ended = next((s for s in summaries if s.stopped_by in signalled),
                 next((s for s in summaries if s.stopped_by != StopReason.NODE_FAILURE),
                      summaries[0]))
    return RunSummary(measured=sum(s.measured for s in summaries),
                      infeasible=sum(s.infeasible for s in summaries),
                      stopped_by=ended.stopped_by, stop_reason=ended.stop_reason,
                      best=whole(storage, highest(trials)), trials=trials)
