"""The baselines: random, grid (plan order) and cost-model-only (predicted order)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from autotune.layout import Layout
from autotune.search._base import FitProbability, Observation, Predictor, Strategy

__all__ = ["RandomStrategy", "GridStrategy", "CostModelOnlyStrategy", "log_predictions",
           "log_fit_probabilities"]


class RandomStrategy(Strategy):
    """Uniformly random untried candidate (the yardstick: ``(N+1)/(k+1)`` trials expected
    to reach one of ``k`` good layouts among ``N``). No OOM skipping: a pure baseline."""

    name = "random"
    skip_oom_dominated = False

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._rng = random.Random(seed)

    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout:
        return self._rng.choice(free)


class GridStrategy(Strategy):
    """Candidates in plan order (:func:`autotune.search.plan_order`), first untried first."""

    name = "grid"
    skip_oom_dominated = False

    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout:
        return free[0]


def log_predictions(layouts: Sequence[Layout], predict: Predictor | None) -> list[float]:
    """``log`` of each predicted throughput; zeros without a model.

    A prediction that is not a positive finite number (the model refuses the layout)
    ranks below every real prediction: half the smallest one.
    """
    if predict is None:
        return [0.0] * len(layouts)
    raw = []
    for lay in layouts:
        try:
            p = float(predict(lay))
        except (ArithmeticError, ValueError):
            p = math.nan
        raw.append(math.log(p) if p > 0 and math.isfinite(p) else None)
    finite = [v for v in raw if v is not None]
    floor = (min(finite) - math.log(2.0)) if finite else 0.0
    return [floor if v is None else v for v in raw]


def log_fit_probabilities(layouts: Sequence[Layout],
                          p_fit: FitProbability | None) -> list[float]:
    """``log`` of each layout's probability of fitting (``-inf`` for 0); zeros without
    one (every layout taken to fit)."""
    if p_fit is None:
        return [0.0] * len(layouts)
    out = []
    for lay in layouts:
        p = float(p_fit(lay))
        out.append(math.log(p) if p > 0 and math.isfinite(p) else -math.inf)
    return out


class CostModelOnlyStrategy(Strategy):
    """Measure in the cost model's expected order, the predicted throughput times the
    probability of fitting (best first), skipping OOM-dominated layouts; ties keep plan
    order. Learns nothing from the measurements (``p_fit`` does: it is asked anew)."""

    name = "cost-model-only"

    def __init__(self, *, seed: int = 0, predict: Predictor,
                 p_fit: FitProbability | None = None) -> None:
        super().__init__(seed=seed)
        self._predict = predict
        self._p_fit = p_fit
        self._cache: dict[Layout, float] = {}

    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout:
        if any(lay not in self._cache for lay in free):
            self._cache = dict(zip(candidates, log_predictions(candidates, self._predict),
                                   strict=True))
        log_p = dict(zip(free, log_fit_probabilities(free, self._p_fit), strict=True))
        # max keeps the first of ties
        return max(free, key=lambda lay: self._cache[lay] + log_p[lay])
