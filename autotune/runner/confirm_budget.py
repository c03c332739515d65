"""What the confirmation round may spend, and what the study already knows of its noise.

Owns three things the round (:mod:`autotune.runner.confirm`) asks before each step:

* :func:`search_cost`: the device-seconds the study's trials spent (every execution in the
  ``measurements`` table: elapsed wall time x world size), the base of
  ``search.confirm_budget``;
* :class:`Allowance`: whether the next step of rounds fits the device budget and the run's
  wall-time limit (``--timeout``, ``search.timeout_s``), from what a run cost so far (the
  round's own runs once it has some, else the candidates' own trials);
* :func:`launch_noise`: the study's launch-to-launch noise, from the layouts it measured
  more than once (a retried layout, a resumed one): the pooled variance of their log
  throughput, with its degrees of freedom. ``None`` when no layout was measured twice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.storage import Storage

__all__ = ["SearchCost", "search_cost", "Allowance", "launch_noise", "LaunchNoise"]


@dataclass(frozen=True)
class SearchCost:
    device_s: float
    """Every execution's elapsed wall time x world size, summed."""
    per_trial_device_s: dict[int, float]
    """Each trial's own (its last execution)."""
    executions: int = 0


def search_cost(storage: Storage, study_name: str) -> SearchCost:
    rows = storage.study_measurements(study_name, ("trial_number", "elapsed_s", "world_size"))
    per: dict[int, float] = {}
    total = 0.0
    for r in rows:
        number = r["trial_number"]
        cost = float(r["elapsed_s"] or 0.0) * int(r["world_size"] or 0)
        total += cost
        per[int(number)] = cost
    return SearchCost(total, per, len(rows))


@dataclass
class Allowance:
    """The round's bounds: ``budget_device_s`` (``None``: none) and a monotonic
    ``deadline`` (``None``: none)."""

    budget_device_s: float | None
    deadline: float | None
    world_size: int
    per_run_device_s: float
    """What one candidate's run is expected to cost: the candidates' trials' (lower)
    median, or in batches the search's mean execution; then the mean of the round's own
    runs."""

    @classmethod
    def of(cls, fraction: float | None, search: SearchCost, trial_numbers: Iterable[int], *,
           world_size: int, deadline: float | None, batched: bool = False) -> Allowance:
        own = sorted(search.per_trial_device_s[n] for n in trial_numbers
                     if n in search.per_trial_device_s)
        if batched and search.executions:
            # One launch per step, as the search's batches: a trial's share of its batch
            # is uneven (the first carries the start-up), their mean is not.
            per_run = search.device_s / search.executions
        else:
            # The median: a study's first launch pays one-time costs (caches, compiling).
            per_run = own[(len(own) - 1) // 2] if own else 0.0
        budget = fraction * search.device_s if fraction is not None else None
        return cls(budget, deadline, world_size, per_run)

    def observe(self, device_s: float, runs: int) -> None:
        """What the round's runs cost so far (``runs`` of them): the next estimate."""
        if runs > 0 and device_s > 0:
            self.per_run_device_s = device_s / runs

    def rounds_within(self, cap: int, members: int, done: int, spent_device_s: float, *,
                      step: int) -> int:
        """The most rounds the round plans: ``cap``, or fewer where the budget affords
        fewer (each round ``members`` runs at the per-run estimate), in whole steps of
        ``step`` rounds. Planned before the first look, the bound is what the verdict's
        looks are counted on (:func:`autotune.trial.paired.looks`), and reaching it ends
        the round with a verdict, not "not decided": the rounds the budget paid for are
        used. Only a count above ``done`` lowers the cap; where the budget affords no
        further step, the step's refusal ends the round as before.

        >>> a = Allowance(100.0, None, 4, 10.0)
        >>> a.rounds_within(12, 3, 0, 0.0, step=2), a.rounds_within(2, 3, 0, 0.0, step=2)
        (2, 2)
        >>> a.rounds_within(12, 2, 0, 0.0, step=2), a.rounds_within(12, 2, 4, 90.0, step=2)
        (4, 12)
        """
        if self.budget_device_s is None or self.per_run_device_s <= 0 or members < 1:
            return cap
        more = int(max(0.0, self.budget_device_s - spent_device_s)
                   // (members * self.per_run_device_s))
        planned = done + more - (done + more) % max(step, 1)
        return min(cap, planned) if planned > done else cap

    def refusal(self, runs: int, spent_device_s: float) -> tuple[str, str] | None:
        """Why a step of ``runs`` runs may not start: ``("budget" | "timeout", words)``."""
        step = runs * self.per_run_device_s
        if self.deadline is not None:
            left_s = self.deadline - time.monotonic()
            if left_s <= step / max(self.world_size, 1):
                return "timeout", (f"{max(left_s, 0.0):.0f} s of the run's wall-time limit "
                                   f"left, a step of {runs} runs takes about "
                                   f"{step / max(self.world_size, 1):.0f} s")
        if self.budget_device_s is not None and spent_device_s + step > self.budget_device_s:
            return "budget", (f"{spent_device_s:.1f} of {self.budget_device_s:.1f} "
                              f"device-s spent, the next {runs} runs need about {step:.1f}")
        return None


@dataclass(frozen=True)
class LaunchNoise:
    var: float
    """Variance of one layout's log throughput from launch to launch."""
    df: int
    """Its degrees of freedom: repeated executions minus layouts repeated."""

    @property
    def pct(self) -> float:
        return 100.0 * math.sqrt(self.var)


def launch_noise(storage: Storage, study_name: str) -> LaunchNoise | None:
    """The pooled launch-to-launch variance of the study's repeated layouts (module
    docstring)."""
    rows = storage.study_measurements(study_name, ("layout_key", "model_tflops_per_device"),
                                      outcome="complete")
    by_key: dict[str, list[float]] = {}
    for key, value in ((r["layout_key"], r["model_tflops_per_device"]) for r in rows):
        if value is not None and value > 0:
            by_key.setdefault(str(key), []).append(math.log(float(value)))
    squares, df = 0.0, 0
    for xs in by_key.values():
        if len(xs) > 1:
            mean = sum(xs) / len(xs)
            squares += sum((x - mean) ** 2 for x in xs)
            df += len(xs) - 1
    return LaunchNoise(squares / df, df) if df > 0 else None
