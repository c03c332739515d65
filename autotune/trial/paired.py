"""The confirmation round's statistics, pure: which layouts to re-measure, and the verdict.

A trial's interval sees the noise *within* its own run only; drift between trials (a
neighbour's job starting, a throttled node, a busy file system) is invisible to it.
Measuring the top layouts side by side, interleaved, puts each round's members under the
same conditions, so the per-round ratio of two of them cancels what they shared.

* :func:`overlapping`: the candidates, the measured layouts whose throughput interval
  (from the trial's stored ``measure_precision``) overlaps the best's, at most ``k``;
* :func:`paired_decision`: the winner (the highest median throughput relative to its
  round), the runner-up, and an interval of the per-round ratio winner / runner-up.

The decision rule. Let ``d_i = ln(winner_i / runner_up_i)`` over ``n`` complete rounds. Its
per-round variance is the pooled estimate (Student's two-sample pooling, any statistics
text, e.g. Wasserman, *All of Statistics*, 2004, section 10.1) ``v = ((n - 1) s^2 + df0 v0)
/ (n - 1 + df0)``, never below ``w``, where ``s^2`` is the rounds' own spread, ``v0`` the
noise known before the round (:class:`Noise`: each run's own step-time precision, as ``w``,
or, when each run is its own launch and the study measured it, twice its launch-to-launch
variance where that is larger) and ``df0`` that knowledge's degrees of freedom. The
interval is ``exp(mean d +- t * sqrt(v / n))`` with ``t`` Student's quantile at ``df = n -
1 + df0`` and level ``1 - alpha / (2 L)``: ``alpha = 1 - confidence`` split over the ``L``
looks the round can take (:func:`looks`; Bonferroni), so that taking the verdict after
every step does not inflate it. Stated error rate: when the per-round log-ratio is normal
with at most variance ``v``, the round calls two equally fast layouts distinguishable with
probability at most ``alpha`` (5%), and names the slower of two layouts the faster with at
most ``alpha / 2``, over all its looks together. ``tests/runner/test_paired_rule.py``
measures both on replayed tables with injected drift. Two rounds (A B, then B A: a drift
linear in time cancels) are the fewest it decides on; with the runs' noise known and small,
two are enough. The verdict is *equivalent* once the whole interval lies within
``+-margin`` (the study's ``trial.measure_precision``): more rounds cannot matter then.

>>> rounds = [{"a": 10.0, "b": 9.0}, {"a": 10.0, "b": 9.0}]
>>> d = paired_decision(rounds, noise=Noise(1e-4, 1e-4, 20))  # runs known to 1%
>>> d.winner, d.runner_up, round(d.ratio, 3), d.distinguishable
('a', 'b', 1.111, True)
>>> paired_decision(rounds[:1]).interval is None  # one round gives no interval
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import run_defaults

__all__ = ["ConfirmCandidate", "PairedDecision", "Noise", "overlapping", "paired_decision",
           "min_rounds", "settled", "decision_line", "cost_line", "throughput_interval",
           "looks", "log_ratio_interval", "equivalence_text", "CONFIDENCE", "MIN_ROUNDS",
           "ROUNDS_PER_STEP"]

CONFIDENCE = run_defaults.CONFIDENCE
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


MIN_ROUNDS = 2
"""The fewest rounds a verdict is taken on: A B, then B A."""
ROUNDS_PER_STEP = 2
"""Rounds added per step: an even number keeps the order alternation."""


def looks(max_rounds: int) -> int:
    """How many verdicts a round of at most ``max_rounds`` takes (one per step).

    >>> looks(12), looks(2), looks(5)
    (6, 1, 3)
    """
    return max(1, math.ceil(max(max_rounds, MIN_ROUNDS) / ROUNDS_PER_STEP))


def min_rounds() -> int:
    """The fewest paired rounds with an interval (:data:`MIN_ROUNDS`)."""
    return MIN_ROUNDS


@dataclass(frozen=True)
class Noise:
    """What is known of a round's noise before its spread is seen."""

    run_var: float = 0.0
    """Variance of one round's log-ratio from its runs' own step-time precision."""
    prior_var: float = 0.0
    """The per-round log-ratio variance known beforehand (``run_var`` plus, when each run
    is its own launch, twice the study's launch-to-launch variance)."""
    prior_df: int = 0
    """Degrees of freedom of ``prior_var`` (0: nothing known; the rounds alone decide)."""


@dataclass(frozen=True)
class PairedDecision:
    winner: str
    runner_up: str | None
    ratio: float | None
    """The geometric mean over rounds of winner / runner-up throughput."""
    interval: tuple[float, float] | None
    """Its interval (module docstring); ``None``: too few rounds."""
    rounds: int
    """Complete rounds (every member measured) the decision is made on."""
    confidence: float = CONFIDENCE
    ties: int = 0
    """Rounds in which the runner-up was at least as fast (ratio <= 1)."""
    margin: float = 0.05
    """Relative difference below which two layouts count as equivalent."""

    @property
    def distinguishable(self) -> bool:
        return self.interval is not None and self.interval[0] > 1.0

    @property
    def equivalent(self) -> bool:
        """The whole interval within ``+-margin``: the two are equally fast, as measured."""
        return (self.interval is not None and not self.distinguishable
                and self.interval[0] >= 1.0 / (1.0 + self.margin)
                and self.interval[1] <= 1.0 + self.margin)

    @property
    def within_pct(self) -> float | None:
        """How far apart the two may be, in percent (the interval's farther end)."""
        if self.interval is None:
            return None
        lo, hi = self.interval
        return 100.0 * max(hi - 1.0, 1.0 / lo - 1.0 if lo > 0 else math.inf, 0.0)

    def to_record(self) -> dict[str, Any]:
        within = self.within_pct
        return {"winner": self.winner, "runner_up": self.runner_up,
                "ratio": self.ratio, "interval": list(self.interval) if self.interval else None,
                "rounds": self.rounds, "confidence": self.confidence,
                "distinguishable": self.distinguishable, "equivalent": self.equivalent,
                "within_pct": round(within, 2) if within is not None and
                math.isfinite(within) else None}


def _median(xs: Sequence[float]) -> float:
    s, n = sorted(xs), len(xs)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _t_quantile(p: float, df: int) -> float:
    from scipy.stats import t  # lazily: scipy is heavy and only the verdict needs it

    return float(t.ppf(p, df))


def log_ratio_interval(diffs: Sequence[float], noise: Noise, confidence: float,
                       n_looks: int) -> tuple[float, float] | None:
    """The interval of the mean per-round log-ratio (module docstring), ``None`` with
    fewer than :data:`MIN_ROUNDS` rounds or no degrees of freedom."""
    n = len(diffs)
    df = n - 1 + noise.prior_df
    if n < MIN_ROUNDS or df < 1:
        return None
    mean = sum(diffs) / n
    s2 = sum((x - mean) ** 2 for x in diffs) / (n - 1)
    var = max(((n - 1) * s2 + noise.prior_df * noise.prior_var) / df, noise.run_var)
    half = _t_quantile(1.0 - (1.0 - confidence) / (2.0 * n_looks), df) * math.sqrt(var / n)
    return mean - half, mean + half


def paired_decision(rounds: Sequence[Mapping[str, float]],
                    confidence: float = CONFIDENCE, *, noise: Noise = Noise(),
                    max_rounds: int = 12, margin: float = 0.05) -> PairedDecision:
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
        return PairedDecision(winner, None, None, None, len(rounds), confidence,
                              margin=margin)
    runner = ranked[1]
    diffs = [math.log(r[winner] / r[runner]) for r in rounds]
    found = log_ratio_interval(diffs, noise, confidence, looks(max_rounds))
    interval = (math.exp(found[0]), math.exp(found[1])) if found is not None else None
    return PairedDecision(winner, runner, math.exp(sum(diffs) / len(diffs)), interval,
                          len(rounds), confidence, ties=sum(x <= 0.0 for x in diffs),
                          margin=margin)


def settled(decision: PairedDecision, max_rounds: int) -> bool:
    """Whether more rounds are pointless: distinguishable, equivalent, or the cap reached.

    >>> tight = Noise(1e-4, 1e-4, 30)
    >>> settled(paired_decision([{"a": 2.0, "b": 1.0}] * 2, noise=tight), 12)
    True
    >>> settled(paired_decision([{"a": 1.0, "b": 1.0}] * 2, noise=tight), 12)  # equivalent
    True
    >>> settled(paired_decision([{"a": 1.1, "b": 1.0}, {"a": 1.0, "b": 1.1}]), 12)
    False
    """
    return (decision.distinguishable or decision.equivalent
            or decision.rounds >= max_rounds or decision.runner_up is None)


def equivalence_text(record: Mapping[str, Any]) -> str | None:
    """"equivalent to X within +-Y%" where the round showed the named best and the other
    equally fast; ``None`` elsewhere."""
    other = record.get("equivalent_to")
    within = record.get("within_pct")
    if not record.get("equivalent") or not other or within is None:
        return None
    return f"equivalent to {other} within ±{float(within):.1f}%"


def decision_line(record: Mapping[str, Any]) -> str:
    """The verdict in words, as ``status``, ``best`` and the report show it."""
    if record.get("state") == "budget":
        return (f"not decided within the budget ({record.get('note')}): the single pass's "
                f"best {record.get('winner')} stands")
    if record.get("runner_up") is None:
        return f"best {record.get('winner')}: {record.get('note') or 'no runner-up'}"
    pct = round(100 * float(record.get("confidence") or CONFIDENCE))
    interval = record.get("interval")
    ival = (f"{pct}% interval [{interval[0]:.2f}, {interval[1]:.2f}]" if interval
            else f"no {pct}% interval yet")
    ratio = record.get("ratio")
    ratio_text = f"{ratio:.2f}x" if isinstance(ratio, (int, float)) else "?x"
    rounds = f"{record.get('rounds', 0)} paired rounds"
    if record.get("distinguishable"):
        return (f"best {record['winner']} {ratio_text} the runner-up {record['runner_up']}, "
                f"{ival}, {rounds}: distinguishable")
    paired = record.get("paired_winner") or record["runner_up"]
    equivalent = equivalence_text(record)
    single = record.get("single_pass")
    whose = ("the single pass's" if single in (None, record["winner"]) else
             f"favoured by the paired rounds over the single pass's {single}")
    if equivalent is not None:
        return (f"best {record['winner']} ({whose}), {equivalent} "
                f"({paired} / {record['runner_up']} {ratio_text}, {ival}, {rounds})")
    return (f"best {record['winner']} ({whose}): not distinguishable from "
            f"{record.get('equivalent_to') or record['runner_up']} ({paired} / "
            f"{record['runner_up']} {ratio_text}, {ival}, {rounds})")


def cost_line(record: Mapping[str, Any]) -> str:
    """What the confirmation round cost (launches, device-seconds: wall time x devices)."""
    return (f"confirmation cost: {record.get('launches', 0)} launches, "
            f"{float(record.get('device_s') or 0.0):.1f} device-seconds")
