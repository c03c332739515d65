"""Optuna on both sides: TPE/GP as strategies, and the adapter to a real ``optuna.Study``.

**Parameters.** A layout is told to Optuna as five categorical parameters ``tp``, ``pp``,
``micro_batch``, ``zero_stage``, ``recompute`` (``dp`` and ``grad_accum`` follow from the
world size and the global batch). Per-axis parameters, rather than one categorical
``layout`` key, let the dashboard's parameter importance say *which axis* matters and let
TPE/GP model each axis; a single key would be 30 unrelated categories to both. The
choices of each axis are the values present among the candidates, sorted, so they are
the same for every trial of a study (Optuna refuses a categorical whose choices change).

**TPE/GP strategies** keep a private in-memory study that mirrors the history. A sampled
combination that is not a candidate (infeasible) is told as PRUNED (never launched) and
the sampler asked again; one that was measured already is told as FAIL (no new
information) and asked again; after :data:`MAX_ASKS` such asks the last proposal is
projected onto the untried candidate that differs from it in the fewest axes (random among
ties), so the strategy always proposes an untried candidate and stays near the sampler's
choice (GP's acquisition often peaks on a measured point: asking it again is slow and
returns the same point).

The real study is driven by :mod:`autotune.runner.study`, which asks a strategy for the next
layout, enqueues its five axis parameters and reads the outcome back from its trials.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from autotune.layout import Layout
from autotune.search._base import Observation, Strategy

__all__ = ["MAX_ASKS", "STARTUP_TRIALS", "axis_distributions", "layout_from_params",
           "OptunaSamplerStrategy"]

MAX_ASKS = 4
STARTUP_TRIALS = 3
"""Random trials before TPE/GP model anything: Optuna's default of 10 would make both
pure random search within a budget of ~10 trials."""


def axis_distributions(candidates: Sequence[Layout]) -> dict[str, BaseDistribution]:
    """One categorical distribution per axis, over the values among the candidates."""
    return {axis: CategoricalDistribution(sorted({getattr(c, axis) for c in candidates},
                                                 key=lambda v: (str(type(v)), v)))
            for axis in Layout.SEARCH_AXES}


def layout_from_params(params: dict[str, Any], candidates: Sequence[Layout]) -> Layout | None:
    """The candidate with these axis values, ``None`` if there is none (infeasible)."""
    wanted = {axis: params.get(axis) for axis in Layout.SEARCH_AXES}
    for lay in candidates:
        if lay.params() == wanted:
            return lay
    return None


class OptunaSamplerStrategy(Strategy):
    """An Optuna sampler (TPE, GP) behind the strategy interface."""

    skip_oom_dominated = False  # the sampler learns from the OOMs it is told

    def __init__(self, name: str, make_sampler: Callable[[int], optuna.samplers.BaseSampler],
                 *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self.name = name
        self._make_sampler = make_sampler
        self._rng = random.Random(seed)
        self._study: optuna.Study | None = None
        self._told: list[Observation] = []
        self._dists: dict[str, BaseDistribution] = {}

    def _reset(self, candidates: Sequence[Layout]) -> None:
        self._study = optuna.create_study(direction="maximize",
                                          sampler=self._make_sampler(self.seed))
        self._told = []
        self._dists = axis_distributions(candidates)

    def _sync(self, candidates: Sequence[Layout], history: Sequence[Observation]) -> None:
        """Tell the private study what it has not seen; rebuild if history was rewritten."""
        if (self._study is None or self._dists != axis_distributions(candidates)
                or list(history[:len(self._told)]) != self._told):
            self._reset(candidates)
        assert self._study is not None
        for obs in history[len(self._told):]:
            if obs.status == "pending":
                break  # told once it has finished
            self._study.enqueue_trial(obs.layout.params())
            trial = self._study.ask(self._dists)
            if obs.status == "ok":
                self._study.tell(trial, obs.value)
            elif obs.status == "oom":
                self._study.tell(trial, state=TrialState.PRUNED)
            else:
                self._study.tell(trial, state=TrialState.FAIL)
            self._told.append(obs)

    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout:
        self._sync(candidates, history)
        assert self._study is not None
        free_set = set(free)
        params: dict[str, Any] = {}
        for _ in range(MAX_ASKS):
            trial = self._study.ask(self._dists)
            params = trial.params
            lay = layout_from_params(params, candidates)
            if lay in free_set:
                # Closed as FAIL (ignored by the samplers) so the study has nothing running;
                # the measured result is told by _sync as a new trial once it exists.
                self._study.tell(trial, state=TrialState.FAIL)
                return lay
            # Not a candidate: infeasible (pruned, learned). A repeat: no information.
            self._study.tell(trial, state=TrialState.PRUNED if lay is None else TrialState.FAIL)
        return self._nearest(params, free)

    def _nearest(self, params: dict[str, Any], free: list[Layout]) -> Layout:
        def distance(lay: Layout) -> int:
            return sum(value != params.get(axis) for axis, value in lay.params().items())

        best = min(distance(lay) for lay in free)
        return self._rng.choice([lay for lay in free if distance(lay) == best])
