"""Reading a study back: counts by outcome, the best layout, the measured trials.

Used by ``autotune status``, ``autotune best``, the reports and the campaign's progress;
works from the database alone (the study file is not needed once trials exist). Whether a
study is done is :func:`autotune.runner.budget.study_done`'s to say, on the counts
:class:`StudyStatus` holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import UsageError
from autotune.layout import Layout
from autotune.report.timings import TimeBreakdown, breakdown_line, time_breakdown
from autotune.storage import (
    Storage,
    TrialAttr,
    learned_from_line,
    learned_from_of,
    search_stop_line,
    search_stop_of,
    study_fingerprint,
    trial_layout,
    trial_layout_key,
    trial_outcome,
)
from autotune.trial.outcome import Outcome
from autotune.util.text import format_table

__all__ = ["StudyStatus", "load_existing_study", "study_status", "selected_trial",
           "best_layout", "list_studies", "format_statuses", "confirmation_of",
           "confirmation_line"]


@dataclass
class StudyStatus:
    name: str
    n_trials: int
    by_state: dict[str, int]
    by_outcome: dict[str, int]
    best: FrozenTrial | None
    running: list[FrozenTrial] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    search_stop: str | None = None
    """Why the search strategy stopped before the budget, if it last did."""
    search_stop_record: dict[str, Any] | None = None
    """The same as recorded (:func:`autotune.storage.study_records.search_stop_record`): what
    :func:`autotune.runner.budget.study_done` decides on."""
    learned_from: str | None = None
    """What the study's calibration learned from (earlier studies and their measurements,
    the corrections): :func:`autotune.storage.study_records.learned_from_line`."""
    confirmation: str | None = None
    """The confirmation round's verdict and cost (:func:`confirmation_line`)."""
    time: TimeBreakdown = field(default_factory=lambda: time_breakdown([]))
    """Where the trials' wall time went, by phase (start-up, build, warm-up, measured
    steps, teardown): :mod:`autotune.report.timings`."""

    retries: int = 0
    """Layouts whose execution was cut short (killed, interrupted), waiting to be re-run
    (their claims: :func:`autotune.storage.claims.claim_counts`; set by callers that hold
    the storage)."""

    @property
    def waiting(self) -> int:
        """Executions waiting to start: retries (and trials a study of an earlier version
        enqueued)."""
        return self.by_state.get(TrialState.WAITING.name, 0) + self.retries


def list_studies(storage: Storage) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage.optuna)]


def load_existing_study(storage: Storage, name: str) -> optuna.Study:
    """The study ``name``; a clear usage error listing what exists otherwise."""
    try:
        return optuna.load_study(study_name=name, storage=storage.optuna)
    except KeyError:
        names = list_studies(storage)
        known = ", ".join(names) if names else "none"
        raise UsageError(f"no study named {name!r} in {storage.masked_url} "
                         f"(studies there: {known})") from None


def selected_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best completed trial under the study's ``search.objective``
    (:func:`autotune.objective.select_best`; throughput for studies run before it)."""
    from autotune.objective import select_best
    from autotune.storage import StudyAttr, TrialAttr, complete_only, trial_energy

    done = complete_only(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    selection = study.user_attrs.get(StudyAttr.SELECTION)
    confirmed = _confirmed_winner(study, done, selection)
    if confirmed is not None:
        return confirmed
    return select_best(done, selection,
                       joules_per_token=lambda t: trial_energy(t)[TrialAttr.JOULES_PER_TOKEN])


def confirmation_of(study: optuna.Study) -> dict[str, Any] | None:
    """The confirmation round's record (:mod:`autotune.runner.confirm`), if the study has
    one, with ``stale`` set when trials completed after it."""
    from autotune.storage import StudyAttr

    record = study.user_attrs.get(StudyAttr.CONFIRMATION)
    if not isinstance(record, dict):
        return None
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    return {**record, "stale": done != record.get("complete_trials")}


def confirmation_line(study: optuna.Study) -> str | None:
    """``status``, ``best`` and the report's words for it (``None``: no round ran)."""
    from autotune.trial.paired import cost_line, decision_line

    record = confirmation_of(study)
    if record is None:
        return None
    line = f"{decision_line(record)}; {cost_line(record)}"
    if record["stale"]:
        line += (" (stale: trials completed since; the next run checks the candidates: "
                 "unchanged, it keeps this verdict and measures nothing; with a new rival, "
                 "it confirms again)")
    return line


def _confirmed_winner(study: optuna.Study, done: list[FrozenTrial],
                      selection: Any) -> FrozenTrial | None:
    """The confirmation round's winner, while it holds: same completed trials, and the
    throughput objective (the round compares throughput only)."""
    objective = selection.get("objective") if isinstance(selection, dict) else None
    record = confirmation_of(study)
    if (record is None or record["stale"] or record.get("state") != "decided"
            or objective not in (None, "throughput")):
        return None
    number = record.get("winner_trial")
    return next((t for t in done if t.number == number), None)


def best_layout(study: optuna.Study) -> tuple[Layout, FrozenTrial]:
    trial = selected_trial(study)
    if trial is None:
        raise UsageError(f"study {study.study_name!r} has no completed trial yet")
    layout = trial_layout(trial)
    if layout is None:  # every trial the runner completes has one
        raise UsageError(f"trial #{trial.number} of study {study.study_name!r} records no "
                         "layout: not a study autotune ran")
    return layout, trial


def study_status(study: optuna.Study) -> StudyStatus:
    trials = study.get_trials(deepcopy=False)
    record = search_stop_of(study)
    return StudyStatus(
        name=study.study_name, n_trials=len(trials),
        by_state=dict(Counter(t.state.name for t in trials)),
        # A trial nobody judged (its runner died: failed stale) counts by its state.
        by_outcome=dict(Counter(trial_outcome(t) or t.state.name.lower()
                                for t in trials if t.state != TrialState.WAITING)),
        best=selected_trial(study),
        running=[t for t in trials if t.state == TrialState.RUNNING],
        fingerprint=study_fingerprint(study),
        search_stop=search_stop_line(record),
        search_stop_record=record,
        learned_from=learned_from_line(learned_from_of(study)),
        confirmation=confirmation_line(study),
        time=time_breakdown(t.user_attrs.get(TrialAttr.TIMINGS_S) or {} for t in trials),
    )


def format_statuses(statuses: list[StudyStatus]) -> str:
    """``autotune status``: one row per study, then each recorded search stop."""
    rows = []
    for st in statuses:
        best, out = st.best, st.by_outcome
        rows.append([st.name, out.get(Outcome.COMPLETE, 0), out.get(Outcome.STOPPED, 0),
                     out.get(Outcome.OOM, 0), out.get(Outcome.INFEASIBLE, 0),
                     # failed: ran and failed (Outcome.observed "error"), or its runner died
                     out.get("fail", 0) + sum(out.get(o, 0) for o in Outcome
                                              if o.observed == "error"),
                     sum(out.get(o, 0) for o in Outcome if o.retry), len(st.running),
                     st.waiting,
                     trial_layout_key(best) if best else None,
                     best.value if best else None])
    lines = [format_table(["study", "complete", "stopped", "oom", "infeasible", "failed",
                           "interrupted", "running", "waiting", "best layout",
                           "best TFLOPS/dev"], rows)]
    lines += [f"{st.name}: search stopped: {st.search_stop}" for st in statuses
              if st.search_stop]
    lines += [f"{st.name}: calibration: {st.learned_from}" for st in statuses
              if st.learned_from]
    lines += [f"{st.name}: confirmation: {st.confirmation}" for st in statuses
              if st.confirmation]
    lines += [f"{st.name}: time: {breakdown_line(st.time)}" for st in statuses
              if st.time.trials]
    from autotune.storage import trial_energy_line

    lines += [f"{st.name}: best: {trial_energy_line(st.best)}" for st in statuses
              if st.best is not None]
    return "\n".join(lines)
