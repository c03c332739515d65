"""The baselines: random, grid (plan order) and cost-model-only (predicted order)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from autotune.layout import Layout
from autotune.search._base import Observation, Predictor, Strategy

__all__ = ["RandomStrategy", "GridStrategy", "CostModelOnlyStrategy", "log_predictions"]


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


class CostModelOnlyStrategy(Strategy):
    """Measure in the cost model's predicted order (best first), skipping OOM-dominated
    layouts; ties keep plan order. Learns nothing from the measurements."""

    name = "cost-model-only"

    def __init__(self, *, seed: int = 0, predict: Predictor) -> None:
        super().__init__(seed=seed)
        self._predict = predict
        self._cache: dict[Layout, float] = {}

    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout:
        if any(lay not in self._cache for lay in free):
            self._cache = dict(zip(candidates, log_predictions(candidates, self._predict),
                                   strict=True))
        return max(free, key=lambda lay: self._cache[lay])  # max keeps the first of ties
