"""Writing Optuna's RDB tables inside autotune's own transactions.

Optuna's :class:`~optuna.storages.RDBStorage` commits every call on its own (a trial's
creation, each user attribute, each value, the state: one transaction each), so a runner
killed while it records a result leaves a trial half-written: values without a state,
an outcome without its reason. This module writes the same rows through
Optuna's own ORM models in a session the caller holds, so that a claim creates its trial
and a record finishes it, each in one transaction with autotune's tables beside them.

Private Optuna API, written against Optuna 5.0's layout and refused outside the known
releases (:mod:`autotune.storage.optuna_pin`) (``optuna/storages/_rdb/models.py``:
``TrialModel``, ``TrialParamModel``, ``TrialValueModel``, ``TrialUserAttributeModel``,
``TrialSystemAttributeModel``; the number as ``TrialModel.count_past_trials`` under the
study row's ``FOR UPDATE`` lock, as ``RDBStorage._create_new_trial`` does). Datetimes are
naive UTC, as that file's ``TrialModel`` comment says. Readers keep using Optuna's public
API: its cached storage re-reads unfinished trials and picks up new trial ids, so rows
written here are seen as if Optuna had written them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.storages._rdb import models
from optuna.trial import TrialState
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autotune.storage.leases import utcnow

__all__ = ["study_id_of", "lock_study", "create_trial", "finish_trial", "trial_state",
           "set_trial_user_attrs", "CONSTRAINT_ATTR"]

CONSTRAINT_ATTR = "constraints:feasible"
"""``optuna.trial.Trial.set_constraint("feasible", v)``'s system attribute (Optuna 5.0
``study/_constrained_optimization.py``: ``_CONSTRAINTS_KEY = "constraints"``)."""


def study_id_of(s: Session, study_name: str) -> int | None:
    return s.scalar(select(models.StudyModel.study_id).where(
        models.StudyModel.study_name == study_name))


def lock_study(s: Session, study_id: int) -> None:
    """Serialize trial creation in the study (PostgreSQL, MySQL: ``SELECT ... FOR UPDATE``
    on its row; SQLite: the writer lock of ``BEGIN IMMEDIATE``, see ``Storage``)."""
    s.execute(select(models.StudyModel.study_id).where(
        models.StudyModel.study_id == study_id).with_for_update())


def create_trial(s: Session, study_id: int, *, state: TrialState,
                 params: Mapping[str, tuple[Any, BaseDistribution]],
                 user_attrs: Mapping[str, Any],
                 system_attrs: Mapping[str, Any] | None = None,
                 value: float | None = None) -> tuple[int, int]:
    """Insert one trial with its parameters and attributes; ``(trial_id, number)``.

    The caller holds the study lock (:func:`lock_study`): the number is the count of the
    study's earlier trials, as in Optuna.
    """
    now = utcnow()
    trial = models.TrialModel(study_id=study_id, number=None, state=state,
                              datetime_start=now,
                              datetime_complete=now if state.is_finished() else None)
    s.add(trial)
    s.flush()
    trial.number = trial.count_past_trials(s)
    trial_id = int(trial.trial_id)
    for name, (val, dist) in params.items():
        s.add(models.TrialParamModel(trial_id=trial_id, param_name=name,
                                     param_value=dist.to_internal_repr(val),
                                     distribution_json=distribution_to_json(dist)))
    _add_attrs(s, models.TrialUserAttributeModel, trial_id, user_attrs)
    _add_attrs(s, models.TrialSystemAttributeModel, trial_id, system_attrs or {})
    if value is not None:
        _add_value(s, trial_id, value)
    s.flush()
    return trial_id, int(trial.number)


def trial_state(s: Session, trial_id: int, *, for_update: bool = False) -> TrialState | None:
    query = select(models.TrialModel.state).where(models.TrialModel.trial_id == trial_id)
    return s.scalar(query.with_for_update() if for_update else query)


def set_trial_user_attrs(s: Session, trial_id: int, attrs: Mapping[str, Any]) -> None:
    """Replace these user attributes of a trial (each key once)."""
    if not attrs:
        return
    s.execute(delete(models.TrialUserAttributeModel).where(
        models.TrialUserAttributeModel.trial_id == trial_id,
        models.TrialUserAttributeModel.key.in_(list(attrs))))
    _add_attrs(s, models.TrialUserAttributeModel, trial_id, attrs)


def finish_trial(s: Session, trial_id: int, *, state: TrialState, value: float | None,
                 user_attrs: Mapping[str, Any],
                 system_attrs: Mapping[str, Any] | None = None,
                 intermediate: Mapping[int, float] | None = None) -> bool:
    """Finish a RUNNING trial: values, intermediate values (step -> value), attributes and
    state together. ``False`` (nothing written) when it is no longer RUNNING: someone else
    finished it (a repair)."""
    row = s.get(models.TrialModel, trial_id, with_for_update=True)
    if row is None or row.state != TrialState.RUNNING:
        return False
    set_trial_user_attrs(s, trial_id, user_attrs)
    if system_attrs:
        s.execute(delete(models.TrialSystemAttributeModel).where(
            models.TrialSystemAttributeModel.trial_id == trial_id,
            models.TrialSystemAttributeModel.key.in_(list(system_attrs))))
        _add_attrs(s, models.TrialSystemAttributeModel, trial_id, system_attrs)
    if value is not None:
        _add_value(s, trial_id, value)
    for step, step_value in (intermediate or {}).items():
        stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(
            step_value)
        s.add(models.TrialIntermediateValueModel(trial_id=trial_id, step=step,
                                                 intermediate_value=stored,
                                                 intermediate_value_type=kind))
    row.state = state
    row.datetime_complete = utcnow()
    return True


def _add_attrs(s: Session, model: Any, trial_id: int, attrs: Mapping[str, Any]) -> None:
    for key, val in attrs.items():
        s.add(model(trial_id=trial_id, key=key, value_json=json.dumps(val)))


def _add_value(s: Session, trial_id: int, value: float) -> None:
    if math.isnan(value):
        raise ValueError("a trial value must not be NaN")
    stored, kind = models.TrialValueModel.value_to_stored_repr(value)
    s.add(models.TrialValueModel(trial_id=trial_id, objective=0, value=stored,
                                 value_type=kind))
