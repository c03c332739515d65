"""Which measured layout is the study's best: ``search.objective``.

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

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["OBJECTIVES", "select_best", "selection_record"]

OBJECTIVES: tuple[str, ...] = ("throughput", "energy", "throughput-within")


def selection_record(objective: str, throughput_within: float) -> dict[str, Any]:
    """The study's ``selection`` attribute (``storage/records.py``, ``StudyAttr``)."""
    return {"objective": objective, "throughput_within": throughput_within}


def select_best(trials: Sequence[Any], record: Any = None, *,
                joules_per_token: Callable[[Any], Any] = lambda t: None) -> Any:
    """The best of ``trials`` (completed, with a ``value``: model TFLOPS per device)
    under the study's selection ``record`` (:func:`selection_record`; ``None``:
    throughput); ``None`` if none. ``joules_per_token(trial)``: its figure, ``None``
    (or 0) where not measured.

    >>> from types import SimpleNamespace as T
    >>> fast, frugal, slow = T(value=10.0, j=2.0), T(value=9.7, j=1.4), T(value=6.0, j=1.0)
    >>> pick = lambda obj: select_best([fast, frugal, slow], selection_record(obj, 0.05),
    ...                                joules_per_token=lambda t: t.j)
    >>> pick("throughput") is fast, pick("energy") is slow, pick("throughput-within") is frugal
    (True, True, True)
    """
    def _jpt(trial: Any) -> float | None:
        value = joules_per_token(trial)
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

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
