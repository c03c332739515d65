"""Where a study's device time went: the trials' wall-time breakdowns, summed by phase.

Every trainer result breaks its wall time into :data:`autotune.trial.PHASES` (the
``timings_s`` of the result; stored on the trial as the ``timings_s`` user attribute and
in the measurement's ``result_json``). The start-up phases (process start and imports,
rendezvous, device and communicator set-up) are a launch's: in a batch only its first
trial pays them, which is what :func:`time_breakdown` shows side by side with the rest.

>>> b = time_breakdown([{"process_start": 2.0, "imports": 6.0, "build": 1.0, "measure": 1.0},
...                     {"build": 1.0, "measure": 1.0}])
>>> b.trials, b.launches, b.totals_s["imports"], round(b.startup_share, 2)
(2, 1, 6.0, 0.67)
>>> breakdown_line(b).split(";")[0]
'2 trials in 1 launch: 12 s of trial wall time, start-up 67%'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autotune.trial import PHASES

__all__ = ["STARTUP_PHASES", "TimeBreakdown", "time_breakdown", "breakdown_line"]

STARTUP_PHASES: tuple[str, ...] = ("process_start", "imports", "rendezvous", "device_setup")
"""The phases a launch pays once, whatever the number of trials in it."""


@dataclass(frozen=True)
class TimeBreakdown:
    trials: int
    launches: int
    """Trials that paid a start-up (the first of each launch)."""
    totals_s: dict[str, float]
    """Seconds per phase, summed over the trials (every phase of PHASES present)."""

    @property
    def total_s(self) -> float:
        return sum(self.totals_s.values())

    @property
    def startup_s(self) -> float:
        return sum(self.totals_s[p] for p in STARTUP_PHASES)

    @property
    def startup_share(self) -> float:
        return self.startup_s / self.total_s if self.total_s > 0 else 0.0


def time_breakdown(timings: Iterable[Mapping[str, float]]) -> TimeBreakdown:
    """Sum the breakdowns of trials (``{}`` or missing phases count as 0)."""
    totals = dict.fromkeys(PHASES, 0.0)
    trials = launches = 0
    for one in timings:
        if not one:
            continue
        trials += 1
        launches += any(float(one.get(p, 0.0)) > 0 for p in STARTUP_PHASES)
        for phase in PHASES:
            value = one.get(phase, 0.0)
            totals[phase] += float(value) if isinstance(value, (int, float)) else 0.0
    return TimeBreakdown(trials, launches, totals)


def breakdown_line(b: TimeBreakdown) -> str:
    """One line for people (``autotune status``)."""
    if not b.trials:
        return "no trial with a time breakdown yet"
    phases = ", ".join(f"{p.replace('_', ' ')} {b.totals_s[p]:.3g} s" for p in PHASES)
    return (f"{b.trials} trial{'s' * (b.trials != 1)} in {b.launches} "
            f"launch{'es' * (b.launches != 1)}: {b.total_s:.3g} s of trial wall time, "
            f"start-up {100 * b.startup_share:.0f}%; {phases}")
