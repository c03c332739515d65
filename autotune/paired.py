"""The confirmation round's statistics, pure: which layouts to re-measure, and the verdict.

A trial's interval sees the noise *within* its own run only; drift between trials (a
neighbour's job starting, a throttled node, a busy file system: issue #24) is invisible to
it. Measuring the top layouts side by side, interleaved, puts each round's members under
the same conditions, so the per-round ratio of two of them cancels what they shared.

* :func:`overlapping`: the candidates, the measured layouts whose throughput interval
  (from the trial's stored ``measure_precision``) overlaps the best's, at most ``k``;
* :func:`paired_decision`: the winner (the highest median throughput relative to its
  round), the runner-up, and the distribution-free confidence interval of the median
  per-round ratio winner / runner-up. The interval is the order-statistic one of
  :func:`autotune.measurement.median_interval` (Conover, *Practical Nonparametric
  Statistics*, 3rd ed., 1999, section 3.2); it excludes 1 exactly when the two-sided sign
  test of "median ratio = 1" rejects at ``1 - confidence`` (Conover 1999, section 3.4, the
  sign test as the test of a median). No assumption on the distribution of the ratios: a
  round under a noisy neighbour is one sign among n, not an outlier that moves a mean.

>>> rounds = [{"a": 10.0, "b": 9.0}] * 6
>>> d = paired_decision(rounds)
>>> d.winner, d.runner_up, round(d.ratio, 3), d.distinguishable
('a', 'b', 1.111, True)
>>> paired_decision(rounds[:5]).interval is None  # 5 rounds give no 95% interval
True
>>> decision_line(d.to_record())
'best a 1.11x the runner-up b, 95% interval [1.11, 1.11], 6 paired rounds: distinguishable'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.measurement import median_interval

__all__ = ["ConfirmCandidate", "PairedDecision", "overlapping", "paired_decision",
           "min_rounds", "settled", "decision_line", "cost_line", "throughput_interval",
           "CONFIDENCE"]

CONFIDENCE = 0.95
"""Confidence of the paired interval: the trials' own (``run.measure_confidence``)."""


@dataclass(frozen=True)
class ConfirmCandidate:
    key: str
    """The layout key."""
    trial_number: int
    value: float
    """The trial's model TFLOPS per device."""
    precision: float | None
    """The relative precision its median step time reached (``None``: not measured)."""


def throughput_interval(value: float, precision: float) -> tuple[float, float]:
    """The throughput interval of a measurement known to ``precision``: the step time
    ``s`` lies in ``s (1 ± p)``, and throughput is proportional to ``1 / s``.

    >>> throughput_interval(10.0, 0.25)
    (8.0, 13.333333333333334)
    """
    high = value / (1.0 - precision) if precision < 1.0 else math.inf
    return value / (1.0 + precision), high


def overlapping(measured: Sequence[ConfirmCandidate], k: int, *,
                assumed_precision: float) -> list[ConfirmCandidate]:
    """The best and the layouts whose interval overlaps the best's, fastest first, ``k``
    at most. A trial without a precision of its own (a replayed table, a program whose
    steps were not read one by one) is taken to be known to ``assumed_precision`` (the
    study's ``trial.measure_precision``): the goal it was measured for.

    >>> c = [ConfirmCandidate("a", 0, 10.0, 0.05), ConfirmCandidate("b", 1, 9.6, 0.05),
    ...      ConfirmCandidate("c", 2, 7.0, 0.05)]
    >>> [x.key for x in overlapping(c, 3, assumed_precision=0.05)]
    ['a', 'b']
    """
    ranked = sorted(measured, key=lambda c: (-c.value, c.trial_number))
    if not ranked or k < 2:
        return ranked[:1]

    def interval(c: ConfirmCandidate) -> tuple[float, float]:
        p = c.precision if c.precision is not None else assumed_precision
        return throughput_interval(c.value, p)

    best_low = interval(ranked[0])[0]
    rivals = [c for c in ranked[1:] if interval(c)[1] >= best_low]
    return [ranked[0], *rivals[:k - 1]]


def min_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest paired rounds with a two-sided interval at ``confidence`` (6 at 95%).

    >>> min_rounds(0.95), min_rounds(0.9)
    (6, 5)
    """
    n = 1
    while median_interval([1.0] * n, confidence) is None:
        n += 1
    return n


@dataclass(frozen=True)
class PairedDecision:
    winner: str
    runner_up: str | None
    ratio: float | None
    """The median over rounds of winner / runner-up throughput."""
    interval: tuple[float, float] | None
    """Its distribution-free interval at ``confidence``; ``None``: too few rounds."""
    rounds: int
    """Complete rounds (every member measured) the decision is made on."""
    confidence: float = CONFIDENCE
    ties: int = 0
    """Rounds in which the runner-up was at least as fast (ratio <= 1)."""

    @property
    def distinguishable(self) -> bool:
        return self.interval is not None and self.interval[0] > 1.0

    def to_record(self) -> dict[str, Any]:
        return {"winner": self.winner, "runner_up": self.runner_up,
                "ratio": self.ratio, "interval": list(self.interval) if self.interval else None,
                "rounds": self.rounds, "confidence": self.confidence,
                "distinguishable": self.distinguishable}


def _median(xs: Sequence[float]) -> float:
    s, n = sorted(xs), len(xs)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def paired_decision(rounds: Sequence[Mapping[str, float]],
                    confidence: float = CONFIDENCE) -> PairedDecision:
    """The verdict of complete ``rounds`` (each: layout key -> throughput measured in that
    round, every member present and positive; the caller drops a round with a failed
    member). The winner has the highest median of its throughput over its round's
    geometric mean (a layout's standing within the round, whatever the round's
    conditions); the runner-up the next highest."""
    if not rounds:
        raise ValueError("paired_decision: no complete round")
    keys = sorted(rounds[0])
    if any(sorted(r) != keys or min(r.values()) <= 0 for r in rounds):
        raise ValueError("paired_decision: every round needs every member, positive")

    def standing(key: str) -> float:
        return _median([r[key] / math.exp(sum(math.log(v) for v in r.values()) / len(r))
                        for r in rounds])

    ranked = sorted(keys, key=lambda k: (-standing(k), k))
    winner = ranked[0]
    if len(ranked) == 1:
        return PairedDecision(winner, None, None, None, len(rounds), confidence)
    runner = ranked[1]
    ratios = [r[winner] / r[runner] for r in rounds]
    return PairedDecision(winner, runner, _median(ratios), median_interval(ratios, confidence),
                          len(rounds), confidence, ties=sum(x <= 1.0 for x in ratios))


def settled(decision: PairedDecision, max_rounds: int) -> bool:
    """Whether more rounds are pointless: distinguishable, the cap reached, or so many
    rounds went the runner-up's way that the sign test cannot reject within the cap.

    >>> settled(paired_decision([{"a": 2.0, "b": 1.0}] * 6), 12)
    True
    >>> settled(paired_decision([{"a": 2.0, "b": 1.0}] * 5 + [{"a": 1.0, "b": 2.0}]), 12)
    False
    """
    if decision.distinguishable or decision.rounds >= max_rounds:
        return True
    if decision.runner_up is None:
        return True
    # With n rounds, the interval's lower end is the l-th smallest ratio; it exceeds 1
    # only if fewer than l ratios are <= 1. l grows with n, so the cap's l bounds it.
    interval_at_cap = median_interval(list(range(max_rounds)), decision.confidence)
    if interval_at_cap is None:
        return False
    allowed = int(interval_at_cap[0])  # the order l - 1 (the values are 0..n-1)
    return decision.ties > allowed


def decision_line(record: Mapping[str, Any]) -> str:
    """The verdict in words, as ``status``, ``best`` and the report show it."""
    if record.get("runner_up") is None:
        return f"best {record.get('winner')}: {record.get('note') or 'no runner-up'}"
    pct = round(100 * float(record.get("confidence") or CONFIDENCE))
    interval = record.get("interval")
    ival = (f"{pct}% interval [{interval[0]:.2f}, {interval[1]:.2f}]" if interval
            else f"no {pct}% interval yet")
    verdict = "distinguishable" if record.get("distinguishable") else "not distinguishable"
    ratio = record.get("ratio")
    ratio_text = f"{ratio:.2f}x" if isinstance(ratio, (int, float)) else "?x"
    return (f"best {record['winner']} {ratio_text} the runner-up {record['runner_up']}, "
            f"{ival}, {record.get('rounds', 0)} paired rounds: {verdict}")


def cost_line(record: Mapping[str, Any]) -> str:
    """What the confirmation round cost (launches, device-seconds: wall time x devices)."""
    return (f"confirmation cost: {record.get('launches', 0)} launches, "
            f"{float(record.get('device_s') or 0.0):.1f} device-seconds")
