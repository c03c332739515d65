"""The value a trial is stored with, and read back with, whatever its Optuna state.

An outcome is told as one Optuna state (:attr:`autotune.trial.outcome.Outcome.state`).
A trial stopped early as hopeless is ``PRUNED``, Optuna's state for a trial cut short,
so that optuna-dashboard shows it as what it is. It keeps what it measured:

* its intermediate values are the per-step model TFLOPS per device (step index -> value),
  what optuna-dashboard's intermediate-values plot draws;
* its value is its measurement (the median over those steps), the number the study
  compares. Optuna's own ``tell`` gives a ``PRUNED`` trial its last intermediate value as
  its value (optuna v5.1.0, ``optuna/study/_tell.py``, ``_tell_with_warning``); autotune
  stores the measurement instead, since that is what its search and reports rank.

Studies stored before this rule hold stopped trials as ``COMPLETE`` with their value.
Both read the same here: :func:`measured_value` is the value of a measured trial (complete
or stopped) and ``None`` otherwise; :func:`complete_only` keeps the trials that may be the
best (``COMPLETE`` and not stopped), what ``best`` and the confirmation round choose among.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from optuna.trial import TrialState

from autotune.storage.keys import TrialAttr
from autotune.trial.outcome import Outcome, Verdict

if TYPE_CHECKING:
    from autotune.trial import TrialResult

__all__ = ["StoredTrial", "measured_value", "is_stopped", "complete_only", "step_tflops",
           "stored_value"]


class StoredTrial(Protocol):
    """An Optuna ``FrozenTrial`` or a narrow read's :class:`~autotune.storage.judged.
    JudgedTrial`: a state, a first value and user attributes."""

    @property
    def state(self) -> TrialState: ...

    @property
    def value(self) -> float | None: ...

    @property
    def user_attrs(self) -> dict[str, Any]: ...


T = TypeVar("T", bound=StoredTrial)


def is_stopped(trial: StoredTrial) -> bool:
    """Stopped early as hopeless: ``PRUNED`` now, ``COMPLETE`` in studies stored before."""
    return trial.user_attrs.get(TrialAttr.OUTCOME) == Outcome.STOPPED.value


def measured_value(trial: StoredTrial) -> float | None:
    """The model TFLOPS per device a trial measured: complete or stopped; ``None`` for a
    trial that measured nothing (an OOM, a failure, a refusal, one still running)."""
    if trial.state == TrialState.COMPLETE or (trial.state == TrialState.PRUNED
                                              and is_stopped(trial)):
        if trial.value is not None:
            return float(trial.value)
        # A PRUNED trial told through Optuna's own API, without autotune's value: its
        # stored throughput, else the median of its per-step values.
        stored = trial.user_attrs.get(TrialAttr.MODEL_TFLOPS)
        if isinstance(stored, (int, float)) and not isinstance(stored, bool):
            return float(stored)
        steps = sorted(v for v in (getattr(trial, "intermediate_values", None) or {}).values()
                       if v is not None)
        if steps:
            mid = len(steps) // 2
            return float(steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2)
    return None


def complete_only(trials: Iterable[T]) -> list[T]:
    """The trials that may be the best: ``COMPLETE`` and not stopped (an old study's stopped
    trials are ``COMPLETE``, with a value below the bar they were stopped under)."""
    return [t for t in trials if t.state == TrialState.COMPLETE and not is_stopped(t)]


def step_tflops(result: TrialResult | None) -> dict[int, float]:
    """The per-step model TFLOPS per device of a result, by timed step (0, 1, ...).

    The objective is ``model_flops_per_step / (step_time_s * world_size)``
    (``trainer/measure.py``), so a step of time ``t`` ran at
    ``model_tflops_per_device * step_time_s / t``, ``step_time_s`` being the median the
    result's value is computed from. Empty where the result lacks either.
    """
    if result is None or not result.step_times_s:
        return {}
    value, median = result.model_tflops_per_device, result.step_time_s
    if value is None or not median or median <= 0:
        return {}
    return {i: value * median / t for i, t in enumerate(result.step_times_s) if t > 0}


def stored_value(verdict: Verdict) -> float | None:
    """The value a trial of ``verdict`` is stored with: its measurement when it measured
    one (complete or stopped), else none."""
    return verdict.value if verdict.kind.measured and verdict.kind.observed == "ok" else None
