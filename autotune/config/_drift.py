"""``launcher.replay.drift``: injected drift for replayed tables.

A replayed table answers every trial of a layout with the same figure, which no real
machine does: its speed drifts (another job on the node or the network, a throttled
device). A drift rule makes the replay launcher (:mod:`autotune.launchers.replay`) answer
a layout as if the machine were ``factor`` times slower at that moment, so that the
confirmation round and the benchmarks can be tested against drift a single pass cannot
see. Kept apart from :mod:`autotune.config.launcher` so that its items are read as a
list, not as a section of their own, by the reference generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config._fields import check_float, check_keys, check_text
from autotune.errors import SpecError

__all__ = ["DriftRule", "drift_rules", "MAX_DRIFT_FACTORS"]

MAX_DRIFT_FACTORS = 100_000


@dataclass(frozen=True)
class DriftRule:
    """A time-varying factor on a replayed layout's step time (``launcher.replay.drift``)."""

    layout: str
    """A layout key of the table, or ``*`` for every layout."""
    factors: tuple[float, ...]
    """The factor of the launcher's n-th answer (0-based, counted over every layout it
    answered in this run); the last one holds after the list ends."""


def drift_rules(data: Any) -> tuple[DriftRule, ...]:
    allowed = ("allowed: a list of {layout: KEY or '*', factors: [positive numbers]} (the "
               "n-th answer's step time is multiplied by factors[n], the last one after)")
    if not isinstance(data, list):
        raise SpecError("launcher.replay.drift", data, allowed)
    rules = []
    for i, item in enumerate(data):
        where = f"launcher.replay.drift[{i}]"
        item = check_keys(where, item, ("layout", "factors"))
        layout, factors = item.get("layout"), item.get("factors")
        if not isinstance(layout, str) or not layout:
            raise SpecError(f"{where}.layout", layout, "allowed: a layout key or '*'")
        check_text(f"{where}.layout", layout, max_chars=96)
        if (not isinstance(factors, list) or not factors
                or len(factors) > MAX_DRIFT_FACTORS):
            raise SpecError(f"{where}.factors", factors,
                            f"allowed: a list of 1..{MAX_DRIFT_FACTORS} positive numbers")
        for j, f in enumerate(factors):
            check_float(f"{where}.factors[{j}]", f, strict=True, maximum=1e6)
        rules.append(DriftRule(layout, tuple(float(f) for f in factors)))
    return tuple(rules)
