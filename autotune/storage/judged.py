"""The finished trials of a study as a strategy sees them, read narrowly.

A worker asks for the study's history before each proposal
(:func:`autotune.runner.optuna_io.history`). Through ``study.get_trials`` that was
Optuna's whole trials: five ``SELECT``s and an ORM object per row of parameters, values
and some twenty user attributes, then JSON-decoded. Its cache also reads every unfinished
trial again on every call (optuna 5.0, ``_CachedStorage._read_trials_from_remote_storage``).
With 64 workers each one read every trial of the study whole about twice. That was a
quarter of the workers' CPU (``benchmarks/many_workers.py --start fork --profile``).

The history needs four things of each finished trial: its number, state, value, and the
two attributes that say what it ran and how it ended (``layout_dict``, ``outcome``).
:func:`judged_trials` reads just those (or the few a run's closing table shows,
:data:`SUMMARY_KEYS`, where each worker read the whole study once more) in one query on
Optuna's tables (the same rows ``get_trials`` reads; the value decoded as
``TrialValueModel.stored_repr_to_value`` does). Private Optuna API, refused outside the
known releases (:mod:`autotune.storage.optuna_pin`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import and_, select

from autotune.storage.keys import TrialAttr
from autotune.storage.values import complete_only

if TYPE_CHECKING:
    from autotune.storage.db import Storage

__all__ = ["JudgedTrial", "AnyTrial", "judged_trials", "highest", "best_judged",
           "read_best_trial", "whole", "FINISHED", "HISTORY_KEYS", "SUMMARY_KEYS"]

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

HISTORY_KEYS = (TrialAttr.LAYOUT_DICT, TrialAttr.OUTCOME)
"""What :func:`autotune.storage.records.trial_layout` and ``trial_outcome`` read: a
:class:`JudgedTrial` answers both as a ``FrozenTrial`` does."""

SUMMARY_KEYS = (*HISTORY_KEYS, TrialAttr.LAYOUT, TrialAttr.STEP_TIME_S,
                TrialAttr.PEAK_MEMORY_GIB, TrialAttr.REASON, TrialAttr.TIMINGS_S)
"""What a run's summary holds of each trial (``RunSummary.trials``): what its closing
table reads (:func:`autotune.runner.progress.trials_table`) and the timings a trial's
device-seconds are summed from (``benchmarks/_study_run.py``, ``study_run``)."""


@dataclass(frozen=True)
class JudgedTrial:
    """A trial's number, state, first value and some of its user attributes (the
    ``HasAttrs`` of :mod:`autotune.storage.records`), and its id in the storage."""

    number: int
    state: TrialState
    value: float | None
    trial_id: int
    user_attrs: dict[str, Any] = field(default_factory=dict)


AnyTrial = JudgedTrial | FrozenTrial
"""A trial as the history and the closing table read it: the narrow read's, or Optuna's."""

T = TypeVar("T", JudgedTrial, FrozenTrial)


def highest(trials: Sequence[T]) -> T | None:
    """The completed trial of highest value (throughput) among ``trials`` (in number
    order: the first of equal values), ``None`` before any: what the runner compares each
    new trial with (the study's objective may name another best:
    :func:`autotune.report.results.selected_trial`). Stopped trials are never the best
    (:func:`autotune.storage.values.complete_only`)."""
    done = complete_only(trials)
    return max(done, key=lambda t: t.value or 0.0) if done else None


def best_judged(storage: Storage, study_name: str) -> JudgedTrial | None:
    """:func:`highest` of the study, from the narrow read (its value, not the whole trial)."""
    return highest(judged_trials(storage, study_name, states=(TrialState.COMPLETE,),
                                 keys=(TrialAttr.OUTCOME,)))


def read_best_trial(storage: Storage, study_name: str) -> FrozenTrial | None:
    """:func:`highest` of the study, found by the narrow read; only that trial read whole."""
    return whole(storage, best_judged(storage, study_name))


def whole(storage: Storage, trial: JudgedTrial | None) -> FrozenTrial | None:
    """Optuna's whole trial of a narrow read's ``trial``."""
    return None if trial is None else storage.optuna.get_trial(trial.trial_id)


def judged_trials(storage: Storage, study_name: str, *,
                  states: Sequence[TrialState] | None = FINISHED,
                  keys: Sequence[str] = HISTORY_KEYS) -> list[JudgedTrial]:
    """The study's trials in ``states`` (``None``: all), in number order, with the user
    attributes of ``keys``."""
    T, V = models.TrialModel, models.TrialValueModel
    A, S = models.TrialUserAttributeModel, models.StudyModel
    query = (select(T.trial_id, T.number, T.state, V.value, V.value_type, A.key, A.value_json)
             .join(S, S.study_id == T.study_id)
             .outerjoin(V, and_(V.trial_id == T.trial_id, V.objective == 0))
             .outerjoin(A, and_(A.trial_id == T.trial_id, A.key.in_(keys)))
             .where(S.study_name == study_name))
    if states is not None:
        query = query.where(T.state.in_(states))
    def read() -> list[Any]:
        with storage.session() as s:
            return list(s.execute(query).all())

    # Through the retry layer, as every call is: the run's last read and the final refit
    # call this outside any retried step.
    rows = storage.retrying(f"reading study {study_name!r}'s trials", read)
    trials: dict[int, tuple[int, TrialState, float | None, dict[str, Any]]] = {}
    for trial_id, number, state, value, value_type, key, value_json in rows:
        if trial_id not in trials:
            decoded = (None if value_type is None
                       else V.stored_repr_to_value(value, value_type))
            trials[trial_id] = (number, state, decoded, {})
        if key is not None:
            trials[trial_id][3][key] = json.loads(value_json)
    return [JudgedTrial(n, st, v, tid, attrs)
            for tid, (n, st, v, attrs) in sorted(trials.items(), key=lambda t: t[1][0])]
