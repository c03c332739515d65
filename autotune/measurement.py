"""When to stop measuring a trial: distribution-free bounds on the median step time.

A trial's figure is the median of its timed steps (:mod:`trainer.measure`). Step times
are not normal (a slow step from a page fault or a noisy neighbour is common), so the
bounds here use order statistics only, which hold for any continuous distribution:
the number of timed steps below the true median ``m`` is Binomial(n, 1/2), whatever the
distribution of one step (Conover, *Practical Nonparametric Statistics*, 3rd ed., 1999,
section 3.2, "the confidence interval for a quantile"; also Hollander, Wolfe & Chicken,
*Nonparametric Statistical Methods*, 3rd ed., 2014, section 3.6).

* :func:`median_interval`: the two-sided interval ``[x_(l), x_(n+1-l)]`` with coverage
  ``1 - 2 P(B <= l-1)``, ``B ~ Binomial(n, 1/2)``; ``l`` the largest with coverage at least
  the confidence asked. It exists from n = 6 steps at 95% (``[min, max]``: 1 - 2/64).
* :func:`relative_precision`: the half-width of that interval over the median; the
  trainer measures until it is at most ``run.measure_precision``.
* :func:`median_lower_bound`: the one-sided bound ``x_(l)`` with ``P(x_(l) > m) =
  P(B <= l-1) <= 1 - confidence``; it exists from n = 5 steps at 95% (the minimum:
  1/32). A trial whose lower bound on the median step time is already slower than the
  study's tolerance of the best allows is hopeless (:func:`hopeless`).

>>> median_interval([0.30, 0.31, 0.29, 0.33, 0.30, 0.32], 0.95)
(0.29, 0.33)
>>> median_interval([0.3] * 5, 0.95) is None  # 5 steps cannot give 95% two-sided
True
>>> round(relative_precision([0.30, 0.31, 0.29, 0.33, 0.30, 0.32], 0.95), 4)
0.0656
>>> median_lower_bound([0.5, 0.6, 0.55, 0.52, 0.58], 0.95)
0.5
>>> hopeless([0.5, 0.6, 0.55, 0.52, 0.58], max_step_time_s=0.45, confidence=0.95)
True
>>> hopeless([0.5, 0.6, 0.55, 0.52], max_step_time_s=0.45, confidence=0.95)  # too few
False
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.config.model import ModelConfig
    from autotune.layout import Layout
    from autotune.trial import RunConfig

__all__ = ["median_interval", "relative_precision", "median_lower_bound", "hopeless",
           "max_step_time_s", "StopRule"]


def _binom_half_cdf(k: int, n: int) -> float:
    """``P(B <= k)`` for ``B ~ Binomial(n, 1/2)``."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: got {confidence!r}; allowed: 0 < confidence < 1")


def median_interval(times_s: Sequence[float],
                    confidence: float) -> tuple[float, float] | None:
    """The distribution-free confidence interval of the median (module docstring), or
    ``None`` when ``len(times_s)`` is too small for ``confidence``."""
    _check_confidence(confidence)
    xs, n = sorted(times_s), len(times_s)
    best = None
    for order in range(1, n // 2 + 1):  # coverage falls as the interval narrows
        if 1.0 - 2.0 * _binom_half_cdf(order - 1, n) >= confidence:
            best = order
        else:
            break
    if best is None:
        return None
    return xs[best - 1], xs[n - best]


def relative_precision(times_s: Sequence[float], confidence: float) -> float | None:
    """Half-width of :func:`median_interval` over the sample median (``None``: too few
    steps for an interval at this confidence)."""
    interval = median_interval(times_s, confidence)
    if interval is None:
        return None
    xs, n = sorted(times_s), len(times_s)
    median = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    return (interval[1] - interval[0]) / (2.0 * median) if median > 0 else math.inf


def median_lower_bound(times_s: Sequence[float], confidence: float) -> float | None:
    """The one-sided lower confidence bound of the median (module docstring), ``None``
    when there are too few steps."""
    _check_confidence(confidence)
    xs, n = sorted(times_s), len(times_s)
    best = None
    for order in range(1, n + 1):
        if _binom_half_cdf(order - 1, n) <= 1.0 - confidence:
            best = order
        else:
            break
    return None if best is None else xs[best - 1]


def max_step_time_s(model_flops_per_step: float, world_size: int, best_tflops: float,
                    tolerance: float) -> float:
    """The slowest median step time still within ``tolerance`` of the best throughput:
    the objective is ``model_flops_per_step / (step_time_s * world_size)``, so a layout
    reaches ``(1 - tolerance) * best`` exactly when its step is at most this long."""
    return model_flops_per_step / (world_size * best_tflops * 1e12 * (1.0 - tolerance))


def hopeless(times_s: Sequence[float], *, max_step_time_s: float, confidence: float) -> bool:
    """Whether the median step time is, at ``confidence``, longer than ``max_step_time_s``
    (the trial cannot come within the tolerance of the best: stop it)."""
    bound = median_lower_bound(times_s, confidence)
    return bound is not None and bound > max_step_time_s


@dataclass(frozen=True)
class StopRule:
    """When a trial's timed steps stop: exactly ``min_steps`` (``precision`` None); or at
    least ``min_steps`` and until :func:`relative_precision` is at most ``precision``, at
    most ``cap``; and, with ``max_step_time_s``, as soon as :func:`hopeless` says so. The
    built-in trainer (:mod:`trainer.measure`) and a user's program measured by autotune
    (:mod:`autotune.workloads.adaptive`) both stop by it.

    >>> rule = StopRule(min_steps=3, cap=8, precision=0.05, confidence=0.95)
    >>> rule.decide([0.30, 0.31, 0.29])       # no interval from 3 steps yet
    (False, None)
    >>> rule.decide([0.30, 0.31, 0.29, 0.30, 0.30, 0.31])
    (True, None)
    >>> StopRule(min_steps=3, cap=3, precision=None, confidence=0.95).decide([0.3] * 3)
    (True, None)
    >>> slow = StopRule(min_steps=3, cap=20, precision=0.01, confidence=0.95,
    ...                 max_step_time_s=0.2)
    >>> slow.decide([0.30, 0.31, 0.29, 0.33, 0.30])  # the bound says so; no interval yet
    (False, None)
    >>> slow.decide([0.30, 0.31, 0.29, 0.33, 0.30, 0.31])[1][:40]
    'median step time >= 0.29 s (95% lower bo'
    """

    min_steps: int
    cap: int
    precision: float | None
    confidence: float
    max_step_time_s: float | None = None
    """The early stop's bar (``None``: no early stop)."""

    @classmethod
    def of(cls, run: RunConfig, model: ModelConfig, layout: Layout, world_size: int, *,
           best_tflops: float | None) -> StopRule:
        """The rule of a trial spec's ``run`` (the trainer's and a foreign program's)."""
        from autotune.models.flops import model_flops_per_step

        bar = None
        if run.early_stop_tolerance is not None and best_tflops:
            bar = max_step_time_s(model_flops_per_step(model, layout.global_batch), world_size,
                                  best_tflops, run.early_stop_tolerance)
        return cls(min_steps=run.measure_steps, cap=run.step_cap,
                   precision=run.measure_precision, confidence=run.confidence,
                   max_step_time_s=bar)

    @property
    def adaptive(self) -> bool:
        """Whether the decision depends on the step times (then ranks must share them)."""
        return self.precision is not None or self.max_step_time_s is not None

    def decide(self, times_s: list[float]) -> tuple[bool, str | None]:
        """(stop now, why it is hopeless or ``None``) after the timed steps so far."""
        n = len(times_s)
        # A verdict waits for an interval of the median too (6 steps at 95%, one more than
        # the bound needs), so that a stopped trial's measurement carries its precision.
        if (self.max_step_time_s is not None and n < self.cap
                and relative_precision(times_s, self.confidence) is not None
                and hopeless(times_s, max_step_time_s=self.max_step_time_s,
                             confidence=self.confidence)):
            bound = median_lower_bound(times_s, self.confidence)
            return True, (f"median step time >= {bound:.4g} s ({self.confidence:.0%} lower "
                          f"bound after {n} steps); within the tolerance of the best "
                          f"needs <= {self.max_step_time_s:.4g} s")
        if n >= self.cap:
            return True, None
        if n < self.min_steps:
            return False, None
        if self.precision is None:
            return True, None
        achieved = relative_precision(times_s, self.confidence)
        return achieved is not None and achieved <= self.precision, None
