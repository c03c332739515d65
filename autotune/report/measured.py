"""The measured value of every trial that has one, however the study stored it.

A trial *complete* is stored COMPLETE with its value. A trial *stopped* early (cut short as
hopeless) has a measured value too, its median over the steps it ran, and has been stored
two ways: COMPLETE with that value (studies stored before) and PRUNED with its per-step
throughput as intermediate values (Optuna's convention for a trial cut short), the outcome
attribute ``stopped`` in both. The report draws both as what they are, a measurement, with
the stopped ones marked; anything else (OOM, error, killed, interrupted) has no value.

>>> import optuna
>>> from optuna.trial import TrialState, create_trial
>>> t = create_trial(state=TrialState.PRUNED, intermediate_values={0: 2.0, 1: 3.0, 2: 2.5},
...                  user_attrs={"outcome": "stopped"})
>>> measured_value(t)
2.5
"""

from __future__ import annotations

import statistics
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune.storage.keys import TrialAttr

__all__ = ["MEASURED_OUTCOMES", "measured_value"]

MEASURED_OUTCOMES = ("complete", "stopped")
"""Outcomes whose trial ran its timed steps and has a throughput."""


def measured_value(t: FrozenTrial | Any) -> float | None:
    """The model TFLOPS per device the trial measured (``None``: it measured none): the
    value of a COMPLETE trial, else the stored ``model_tflops_per_device`` of a stopped
    one, else the median of its intermediate values."""
    outcome = t.user_attrs.get(TrialAttr.OUTCOME, t.state.name.lower())
    if outcome not in MEASURED_OUTCOMES:
        return None
    if t.state == TrialState.COMPLETE and t.value is not None:
        return float(t.value)
    stored = t.user_attrs.get(TrialAttr.MODEL_TFLOPS)
    if isinstance(stored, (int, float)) and not isinstance(stored, bool):
        return float(stored)
    # A narrow trial (autotune.storage.judged.JudgedTrial) carries no intermediate values.
    steps = [v for v in (getattr(t, "intermediate_values", None) or {}).values()
             if v is not None]
    return float(statistics.median(steps)) if steps else None
