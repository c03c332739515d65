"""What trying a layout is worth: expected improvement, weighed by the probability that it
fits, per expected device-second.

A trial of a layout whose memory is uncertain has two outcomes: it runs (probability
``p_fit``) and measures its throughput, costing its build and its steps; or it runs out of
memory in its first step and gives no throughput, costing only the build. The gain is the
expected improvement of the log throughput over the best measured (Jones et al. 1998) if it
fits and nothing if it does not: constrained EI, ``p_fit · EI`` (Gardner et al. 2014,
"Bayesian Optimization with Inequality Constraints", ICML, eq. 3, with the constraint's
probability from the memory verdict instead of a GP). The cost is the expected seconds of
the trial, ``p_fit · (build + steps) + (1 - p_fit) · build``, and the layouts are ranked by
gain per expected second: Snoek, Larochelle and Adams 2012, "Practical Bayesian
Optimization of Machine Learning Algorithms", NIPS, section 3.2 ("EI per second").

So a layout predicted far ahead whose memory is doubtful is tried while its OOM is cheap
next to a full trial (a long step time, few seconds of start-up), and is left for later
where the start-up dominates (an OOM then costs nearly what a trial costs). Its OOM teaches
the rest of the study in any case: the runner conditions every candidate's ``p_fit`` on it
and refits the memory correction (:mod:`autotune.runner.learning`), and the layouts that
need no less memory are skipped. A measured peak moves every ``p_fit`` the same way.

The steps' seconds follow the posterior: a layout expected ``exp(d)`` times faster than the
cost model says takes ``exp(-d)`` of its predicted step time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autotune.layout import Layout

__all__ = ["TrialSeconds", "TrialCost", "gain_per_second", "seed_scores"]


@dataclass(frozen=True)
class TrialSeconds:
    """What one trial of a layout is expected to cost, in seconds of its devices' time
    (the world size is the study's, so it scales every layout alike and is left out)."""

    build_s: float
    """Before the first step: process start, imports, rendezvous, model build. An OOM
    trial costs this alone (it fails in its first step)."""
    steps_s: float
    """Its warm-up and timed steps at the cost model's predicted step time."""

    def __post_init__(self) -> None:
        if not (self.build_s >= 0 and self.steps_s >= 0):
            raise ValueError(f"TrialSeconds: got build_s={self.build_s}, "
                             f"steps_s={self.steps_s}; allowed: numbers >= 0")


TrialCost = Callable[[Layout], "TrialSeconds | None"]
"""The expected seconds of a trial of a layout (:class:`TrialSeconds`), as the runner
estimates them from its launcher and its trials' timing breakdowns; ``None`` while it
cannot say (nothing measured yet): every trial is then taken to cost the same."""


def gain_per_second(ei_if_fits: np.ndarray, p_fit: np.ndarray, build_s: np.ndarray,
                    steps_s: np.ndarray, speedup: np.ndarray) -> np.ndarray:
    """Constrained EI per expected second (module docstring):

    ``p_fit · EI / (build + p_fit · steps / speedup)``

    ``ei_if_fits``: EI of the log throughput given that the layout runs; ``speedup``: the
    posterior's throughput over the cost model's (``exp(mean - log prediction)``), which
    divides the predicted steps' seconds. A cost of 0 (no build, no steps) is taken as the
    smallest positive cost of the others, so that it ranks by its gain alone.

    >>> gain_per_second(np.array([0.1, 0.1]), np.array([1.0, 0.1]), np.array([10.0, 10.0]),
    ...                 np.array([90.0, 90.0]), np.array([1.0, 1.0])).round(5)
    array([0.001  , 0.00053])
    """
    cost = build_s + p_fit * steps_s / np.maximum(speedup, 1e-12)
    positive = cost[cost > 0]
    floor = float(positive.min()) if positive.size else 1.0
    return p_fit * ei_if_fits / np.where(cost > 0, cost, floor)


def seed_scores(log_mean: np.ndarray, log_p: np.ndarray, best_ran: float | None) -> np.ndarray:
    """The seed trials' order (argmax first): the cost model's word taken as it is, the
    memory's doubt kept.

    The seeds are to find the best layout the model knows of, so each next seed is the one
    that adds most to the expected best of the seeds (the greedy step of maximising
    ``E[max_i y_i F_i]``, ``y_i`` the predicted throughput, ``F_i`` whether layout ``i``
    fits, with probability ``p_i``; the multi-point expected improvement of Ginsbourger,
    Le Riche and Carraro 2010, "Kriging is well-suited to parallelize optimization",
    section 3, at zero variance). Before any layout ran that is the largest expected
    throughput, ``log y + log p``. Once some ran, ``best_ran`` (the largest predicted log
    throughput among them) is what the seeds are known to give; a layout adds
    ``p · max(0, log y - best_ran)`` (in log throughput, as the EI after the seeds): the
    layouts predicted faster than every one that ran come first, by that gain, however
    doubtful their memory; where none is, the rest by expected throughput, as before any
    ran. Ranking every seed by its own expected throughput instead put a layout predicted
    7% ahead of the rest, with a 70% chance to fit, behind every layout that surely fits
    (a pure data-parallel 3.6B GPT on 64 A100s, issue #32), though it is the only one that
    can beat the first seed.
    """
    expected = log_mean + log_p
    if best_ran is None:
        return expected
    gain = np.exp(log_p) * np.maximum(0.0, log_mean - best_ran)
    if not (gain > 0).any():
        return expected
    # Every layout with a gain before every one without: lifted above the largest score.
    return np.where(gain > 0, float(np.max(expected)) + 1.0 + gain, expected)
