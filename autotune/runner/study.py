"""The study runner: propose a layout, check it, measure it, record it; resume anywhere.

One worker runs :func:`run_study`. Many workers may run it on the same study and database
at once: a unique layout claim (:meth:`autotune.storage.db.Storage.claim`) keeps every
layout measured once, and the claim order enforces the trial budget exactly.

The loop uses Optuna's ask-and-tell interface rather than ``study.optimize`` because a
trial here is an external process whose interruption must be handled precisely:

* every proposal comes from the search strategy (:mod:`autotune.search`) and is enqueued
  with per-axis parameters, so optuna-dashboard shows (tp, pp, micro_batch, ...);
* an infeasible proposal is told as PRUNED with a violated constraint, never launched;
* a heartbeat thread marks the running trial alive; a runner killed with SIGKILL leaves
  a trial that the next run's :func:`optuna.storages.fail_stale_trials` fails, and
  :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` re-enqueues its layout;
* Ctrl-C or SIGTERM cancels the launcher (the trial's whole process group dies), the
  trial is failed as ``interrupted`` and re-enqueued, and the database stays consistent;
* a strategy that stops early (``search.min_improvement``) ends this worker's run; its
  reason is stored as the study's ``search_stop`` user attribute (``autotune status``
  shows it) and cleared when a later proposal is made. The decision is a function of the
  history alone, so a resumed run reaches it again at once.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.candidates import Candidate, rank_candidates, rank_layouts
from autotune.errors import UsageError
from autotune.feasibility import Constraints, Reason
from autotune.launchers.base import Launcher, TrialPaths
from autotune.layout import Layout
from autotune.results import best_trial
from autotune.runner.lifecycle import StopSignals, heartbeat
from autotune.runner.outcome import Outcome, classify, infeasible
from autotune.runner.progress import Progress
from autotune.runner.records import (
    SEARCH_STOP_ATTR,
    TrialFacts,
    measurement_row,
    search_stop_record,
    user_attrs,
)
from autotune.search import Observation, dominated_by_oom, make_strategy
from autotune.spec import StudySpec
from autotune.storage.db import ClaimResult, Storage
from autotune.trial import TrialSpec

__all__ = ["RunSummary", "run_study", "open_study"]

_MAX_IDLE_PROPOSALS = 200


@dataclass
class RunSummary:
    measured: int = 0
    """Trials this worker launched."""
    infeasible: int = 0
    stopped_by: str = "budget"
    """``budget``, ``timeout``, ``exhausted``, ``strategy`` (it stopped early: see
    ``stop_reason``), ``interrupt`` or ``sigterm``."""
    stop_reason: str | None = None
    """With ``strategy``: the strategy's reason, e.g. ``expected improvement 0.31% < 1%
    after 6 trials (14 layouts untried)``."""
    best: FrozenTrial | None = None
    trials: list[FrozenTrial] = field(default_factory=list)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def open_study(spec: StudySpec, storage: Storage, *, create: bool = True) -> optuna.Study:
    """Create or load the Optuna study; refuse to mix a different model or cluster into it."""
    fingerprint = {"model": spec.model.to_dict(), "device": spec.cluster.device,
                   "world_size": spec.world_size, "global_batch": spec.training.global_batch,
                   "dtype": spec.training.dtype}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if create:
            study = optuna.create_study(
                study_name=spec.name, storage=storage.optuna, direction="maximize",
                load_if_exists=True,
                # Every trial is enqueued by the strategy; this sampler never chooses.
                sampler=optuna.samplers.RandomSampler(seed=spec.search.seed))
        else:
            study = optuna.load_study(study_name=spec.name, storage=storage.optuna)
    existing = study.user_attrs.get("fingerprint")
    if isinstance(existing, dict) and isinstance(existing.get("model"), dict):
        # Studies created before ModelConfig had ``mlp`` / ``attention`` / ``dropout`` ran
        # the (then only) GELU MLP and SDPA attention, without dropout.
        existing = {**existing, "model": {"mlp": "gelu", "attention": "flash",
                                          "dropout": 0.0, **existing["model"]}}
    if existing is None and create:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["model_tflops_per_device"])
        study.set_user_attr("fingerprint", fingerprint)
        study.set_user_attr("model", spec.model.name)
        study.set_user_attr("cluster", f"{spec.cluster.nodes} x {spec.cluster.devices_per_node}"
                            f" {spec.cluster.device}")
        study.set_user_attr("objective", "model TFLOPS per device (higher is better)")
        study.set_user_attr("device_memory_gib",
                            round(spec.cluster.device_spec().memory_bytes / 2**30, 3))
    elif existing is not None and existing != fingerprint:
        diff = sorted(k for k in fingerprint if fingerprint[k] != existing.get(k))
        raise UsageError(
            f"study {spec.name!r} in {storage.masked_url} was created for a different "
            f"{', '.join(diff)}; give this study another name (name: in the study file)")
    return study


_OBSERVED = {"complete": "ok", "oom": "oom", "error": "error", "timeout": "error"}


def _history(study: optuna.Study, claimed: dict[str, int]) -> list[Observation]:
    """What the strategy needs to know: measured layouts with their values, and layouts
    claimed by running trials (``pending``: never proposed twice)."""
    out: list[Observation] = []
    seen: set[str] = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                      TrialState.FAIL)):
        status = _OBSERVED.get(t.user_attrs.get("outcome", ""))
        if status is None or "layout_dict" not in t.user_attrs:
            continue
        layout = Layout.from_dict(t.user_attrs["layout_dict"])
        seen.add(layout.key())
        out.append(Observation(layout, status, t.value if status == "ok" else None))
    for key in claimed:
        if key not in seen:
            out.append(Observation(Layout.from_key(key), "pending"))  # claims hold keys
    return out


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
    constraints = Constraints.from_configs(spec.cluster, spec.training, spec.search, spec.trial)
    table = launchers[0].fixed_layouts()
    if table is None:
        candidates = rank_candidates(spec, constraints)
    else:
        # A replayed table is the space: its rows say what ran and what ran out of memory,
        # so only the structural rules apply (the study's axes, placement and memory
        # model would hide rows that were measured).
        constraints = constraints.structural_only()
        candidates = rank_layouts(spec, [lay for lay in table
                                         if not constraints.check(lay, spec.model)])
    if not candidates:
        raise UsageError(f"{spec.source or spec.name}: no feasible layout in the search space;"
                         f" run `autotune plan {spec.source or 'STUDY'}` to see why")
    study = open_study(spec, storage)  # once, before worker threads could race to create it
    progress = progress or Progress(total=n_trials, enabled=False)
    timeout_s = timeout_s if timeout_s is not None else spec.search.timeout_s
    workers = [_Worker(spec, storage, study, launcher, candidates, constraints, n_trials,
                       progress, name_suffix=f"/{i}" if len(launchers) > 1 else "")
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
                 summaries[0])
    return RunSummary(measured=sum(s.measured for s in summaries),
                      infeasible=sum(s.infeasible for s in summaries),
                      stopped_by=ended.stopped_by, stop_reason=ended.stop_reason,
                      best=best_trial(study), trials=study.get_trials(deepcopy=False))


class _Worker:
    """One worker's loop over the shared study (see the module docstring)."""

    def __init__(self, spec: StudySpec, storage: Storage, study: optuna.Study,
                 launcher: Launcher, candidates: list[Candidate], constraints: Constraints,
                 n_trials: int, progress: Progress, *, name_suffix: str = "") -> None:
        self.spec, self.storage, self.launcher = spec, storage, launcher
        self.candidates, self.constraints = candidates, constraints
        self.n_trials, self.progress = n_trials, progress
        self.by_key: dict[str, Candidate] = {c.layout.key(): c for c in candidates}
        self.study = study
        self.strategy = make_strategy(
            spec.search.strategy, seed=spec.search.seed,
            predict=lambda lay: self.by_key[lay.key()].predicted_tflops
            if lay.key() in self.by_key else 0.0,
            min_improvement=spec.search.min_improvement)
        self.name_suffix = name_suffix
        self.name = f"{socket.gethostname()}:{os.getpid()}{name_suffix}"
        self.run_cfg = spec.run_config()
        self.summary = RunSummary()

    def run(self, timeout_s: float | None, signals: StopSignals) -> RunSummary:
        started = time.monotonic()
        idle = 0
        while True:
            if signals.received is not None:
                self.summary.stopped_by = ("sigterm" if signals.received == signal.SIGTERM
                                           else "interrupt")
                break
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                self.summary.stopped_by = "timeout"
                break
            stop = self._enqueue_next()
            if stop:
                self.summary.stopped_by = stop
                break
            trial = self.study.ask()
            try:
                admitted = self._admit(trial)
            except optuna.exceptions.UpdateFinishedTrialError:
                # SQLite can hand one waiting trial to two workers; the other one has it
                # (and its layout claim). Leave it alone.
                continue
            if admitted == "budget":
                self.summary.stopped_by = "budget"
                break
            if not isinstance(admitted, Layout):
                idle += 1
                if idle > _MAX_IDLE_PROPOSALS:
                    self.summary.stopped_by = "exhausted"
                    break
                continue
            idle = 0
            self._measure(trial, admitted)
        self.summary.best = best_trial(self.study)
        self.summary.trials = self.study.get_trials(deepcopy=False)
        return self.summary

    def _enqueue_next(self) -> str | None:
        """Enqueue the strategy's next layout unless a retry waits; a stop reason if none."""
        optuna.storages.fail_stale_trials(self.study)
        claimed = self.storage.claimed_keys(self.spec.name)
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return None
        if len(claimed) >= self.n_trials:
            return "budget"
        proposal = self.strategy.propose([c.layout for c in self.candidates],
                                         _history(self.study, claimed))
        stop = self.strategy.stop
        if proposal is None and stop is not None:
            self.summary.stop_reason = stop.reason
            self.study.set_user_attr(SEARCH_STOP_ATTR, search_stop_record(
                stop.reason, judged=stop.judged, strategy=self.strategy.name,
                min_improvement=self.spec.search.min_improvement, worker=self.name,
                at=_utcnow()))
            return "strategy"
        if proposal is None:
            return "exhausted"
        if self.study.user_attrs.get(SEARCH_STOP_ATTR) is not None:
            # An earlier stop no longer holds (another threshold, or new measurements).
            self.study.set_user_attr(SEARCH_STOP_ATTR, None)
        self.study.enqueue_trial(proposal.params())
        return None

    def _admit(self, trial: optuna.Trial) -> Layout | str | None:
        """The trial's layout if it may be launched; ``None`` if it was told infeasible or
        skipped; ``"budget"`` when the budget is used up."""
        layout = _suggest(trial, self.spec)
        key = layout.key()
        reasons = self.constraints.check(layout, self.spec.model)
        oom = dominated_by_oom(layout, _history(self.study, {}))
        if oom is not None:
            reasons.append(Reason("oom_dominated", f"needs at least the memory of "
                                  f"{oom.key()}, which ran out of memory"))
        if reasons:
            _tell_infeasible(self.study, trial, layout, infeasible(reasons), self.name)
            self.summary.infeasible += 1
            return None
        claim = self.storage.claim(self.spec.name, key, trial._trial_id, self.name,
                                   may_take_over=lambda owner: _retryable(self.study, owner))
        if claim is ClaimResult.OTHER_WORKER:
            return None  # the same trial was handed to another worker, which runs it
        if claim is ClaimResult.TAKEN:
            _tell_skipped(self.study, trial, layout, "another trial owns this layout")
            return None
        rank = self.storage.claim_rank(self.spec.name, key)
        if rank > self.n_trials and not _is_retry(self.study, trial):
            self.storage.release(self.spec.name, key, trial._trial_id)
            _tell_skipped(self.study, trial, layout, "the trial budget was reached")
            return "budget"
        return layout

    def _measure(self, trial: optuna.Trial, layout: Layout) -> None:
        spec, key = self.spec, layout.key()
        cand = self.by_key.get(key)
        paths = TrialPaths.for_trial(spec.launcher.run_dir, spec.name, trial.number, key)
        trial_spec = TrialSpec(model=spec.model, layout=layout, run=self.run_cfg)
        self.progress.trial_started(trial.number, layout,
                                    cand.predicted_tflops if cand else None)
        t0 = _utcnow()
        with heartbeat(self.storage, trial._trial_id):
            report = self.launcher.run(trial_spec, paths, timeout_s=spec.trial.timeout_s)
        outcome = classify(report)
        facts = TrialFacts(
            study_name=spec.name, trial_number=trial.number, trial_id=trial._trial_id,
            layout=layout, outcome=outcome, result=report.result, launcher=self.launcher.kind,
            worker=self.name, started_at=t0, finished_at=_utcnow(),
            elapsed_s=report.elapsed_s, hosts=report.hosts,
            predicted_tflops_per_device=cand.predicted_tflops if cand else None,
            predicted_memory_bytes=cand.predicted_memory_bytes if cand else None,
            trial_dir=str(paths.root))
        self.storage.add_measurement(measurement_row(
            facts, model=spec.model, cluster=spec.cluster,
            global_batch=spec.training.global_batch, dtype=spec.training.dtype))
        _tell_outcome(self.study, trial, layout, facts)
        if outcome.retry:
            self.study.enqueue_trial(layout.params(),
                                     user_attrs={"retry_of": trial.number})
        self.summary.measured += 1
        self.progress.trial_finished(trial.number, layout, outcome, best_trial(self.study))


def _suggest(trial: optuna.Trial, spec: StudySpec) -> Layout:
    """Read the enqueued layout through distributions that depend only on the study's
    fingerprint (world size, global batch), not on its search space: a resumed study may
    widen or narrow its axes, which Optuna's categorical distributions would refuse."""
    ws, gb = spec.world_size, spec.training.global_batch
    params = {"tp": trial.suggest_int("tp", 1, ws), "pp": trial.suggest_int("pp", 1, ws),
              "micro_batch": trial.suggest_int("micro_batch", 1, gb),
              "zero_stage": trial.suggest_int("zero_stage", 0, 3),
              "recompute": trial.suggest_categorical("recompute", ["none", "full"])}
    return Layout.from_params(params, world_size=ws, global_batch=gb)


def _retryable(study: optuna.Study, owner_trial_id: int) -> bool:
    """A claim may pass on when its trial can no longer measure: failed while stale (the
    runner died: no outcome recorded) or interrupted."""
    try:
        owner = study._storage.get_trial(owner_trial_id)
    except KeyError:
        return True
    return owner.state == TrialState.FAIL and owner.user_attrs.get("outcome") in (
        None, "interrupted")


def _is_retry(study: optuna.Study, trial: optuna.Trial) -> bool:
    """A re-run of a layout whose first run was cut short (it is within the budget)."""
    frozen = study._storage.get_trial(trial._trial_id)
    return "failed_trial" in frozen.system_attrs or "retry_of" in frozen.user_attrs


def _set_attrs(trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    for k, v in attrs.items():
        trial.set_user_attr(k, v)


def _tell_infeasible(study: optuna.Study, trial: optuna.Trial, layout: Layout,
                     outcome: Outcome, worker: str) -> None:
    _set_attrs(trial, {"layout": layout.key(), "layout_dict": layout.to_dict(),
                       "outcome": outcome.kind, "reason": outcome.reason, "worker": worker})
    trial.set_constraint("feasible", 1.0)
    study.tell(trial, state=outcome.state, skip_if_finished=True)  # see _tell_skipped


def _tell_skipped(study: optuna.Study, trial: optuna.Trial, layout: Layout, why: str) -> None:
    _set_attrs(trial, {"layout": layout.key(), "layout_dict": layout.to_dict(),
                       "outcome": "skipped", "reason": why})
    # SQLite can hand one waiting trial to two workers (the run loop's comment): both may
    # reach this verdict; the second tell of the same verdict is a no-op, not an error.
    study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)


def _tell_outcome(study: optuna.Study, trial: optuna.Trial, layout: Layout,
                  facts: TrialFacts) -> None:
    attrs = user_attrs(facts)
    attrs["layout_dict"] = layout.to_dict()
    _set_attrs(trial, attrs)
    outcome = facts.outcome
    if outcome.infeasible:
        trial.set_constraint("feasible", 1.0)
    if outcome.state == TrialState.COMPLETE:
        trial.set_constraint("feasible", 0.0)
        study.tell(trial, outcome.value)
    else:
        study.tell(trial, state=outcome.state)

