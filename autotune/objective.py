"""Which measured layout is the study's best: ``search.objective`` (issue #25).

* ``throughput`` (default): the highest model TFLOPS per device;
* ``energy``: the fewest joules per token;
* ``throughput-within``: the fewest joules per token among the layouts within
  ``search.throughput_within`` (a fraction: 0.05 = 5%) of the best throughput: the trade
  Perseus reports (Chung et al., "Reducing Energy Bloat in Large Model Training", SOSP
  2024: up to 30% less energy at no loss of throughput, from slowing what is off the
  critical path; here the choice is among whole layouts).

The search itself still proposes layouts by predicted throughput (the cost model predicts
no energy); the objective decides which measured one is named best (``status``,
``best``, the report, the scaling table). Where no measured layout has an energy figure,
both energy objectives fall back to throughput and say so: "energy: not measured (no
counter)", never a 0 that would win.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["OBJECTIVES", "SELECTION_ATTR", "select_best", "selection_record"]

OBJECTIVES: tuple[str, ...] = ("throughput", "energy", "throughput-within")
SELECTION_ATTR = "selection"
"""Study user attribute: ``{"objective": ..., "throughput_within": ...}`` as last run."""


class _Trial(Protocol):
    @property
    def value(self) -> float | None: ...

    @property
    def user_attrs(self) -> dict[str, Any]: ...


def selection_record(objective: str, throughput_within: float) -> dict[str, Any]:
    return {"objective": objective, "throughput_within": throughput_within}


def _jpt(trial: _Trial) -> float | None:
    value = trial.user_attrs.get("joules_per_token")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def select_best(trials: Sequence[Any], record: Any = None) -> Any:
    """The best of ``trials`` (completed, with a value) under the study's selection
    ``record`` (:func:`selection_record`; ``None``: throughput); ``None`` if none.

    >>> from types import SimpleNamespace as T
    >>> fast = T(value=10.0, user_attrs={"joules_per_token": 2.0})
    >>> frugal = T(value=9.7, user_attrs={"joules_per_token": 1.4})
    >>> slow = T(value=6.0, user_attrs={"joules_per_token": 1.0})
    >>> pick = lambda obj: select_best([fast, frugal, slow], selection_record(obj, 0.05))
    >>> pick("throughput") is fast, pick("energy") is slow, pick("throughput-within") is frugal
    (True, True, True)
    """
    done = [t for t in trials if t.value is not None]
    if not done:
        return None
    fastest = max(done, key=lambda t: t.value)
    objective = record.get("objective") if isinstance(record, dict) else None
    if objective not in ("energy", "throughput-within"):
        return fastest
    pool = done
    if objective == "throughput-within":
        within = float(record.get("throughput_within") or 0.0)
        pool = [t for t in done if t.value >= (1.0 - within) * fastest.value]
    measured = [t for t in pool if _jpt(t) is not None]
    return min(measured, key=lambda t: (_jpt(t), -t.value)) if measured else fastest
