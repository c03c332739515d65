"""The default strategy: the cost model's ranking, corrected by what the study measures.

The cost model is usually right about the shape of the landscape and wrong about a few
axes (a slow interconnect, a kernel that is faster at one micro-batch). So the strategy

1. measures the cost model's top :data:`SEED_TRIALS` layouts first, in predicted order;
2. then fits, on the measured layouts only, a Bayesian linear model of the residual
   ``r = log(measured) - log(predicted)`` with a trend per doubling of each numeric axis
   (tp, pp, dp, micro-batch, grad-accum), one coefficient per categorical value (ZeRO
   stage, recompute=full, ...), a calibration slope and a shared intercept (the model's
   overall scale error; see :class:`_Features`). Its Gaussian prior shrinks every
   correction towards zero, so one measurement moves the layouts that share its axis
   values a little and the rest not at all (ridge regression = the posterior mean;
   Bishop 2006, section 3.3);
3. proposes the untried layout with the largest expected improvement (Jones et al. 1998)
   of ``log(predicted) + r`` over the best measured, under the posterior variance plus a
   per-layout term for what an additive correction cannot explain;
4. skips layouts that need no less memory than a measured OOM;
5. optionally stops early (issue #5): with ``min_improvement`` set, once
   :data:`SEED_TRIALS` trials have finished and at least one has a value, it proposes
   nothing more when the largest expected improvement among the untried layouts is
   below that fraction. EI is of the log throughput, so it is the expected relative
   gain (``E[max(0, log(y / best))]``, which for a few percent is the fraction itself)
   averaged over the posterior: "another trial is expected to add less than 1%". The
   per-layout term keeps every sd at or above ``LAYOUT_SD``, so the stop needs every
   untried layout predicted well below the best (for 1%: a posterior mean at least 0.25
   below in log, ~22% slower), not just a confident model.

Without a cost model (``predict=None``) the prior mean is flat, and it is plain
Bayesian optimisation over the axes with an additive surrogate, starting in plan order.

The prior's widths are fixed, generic statements about cost models and measurements, not
fitted to any landscape: ``AXIS_SD`` (an axis value may shift throughput by ~30% from
the prediction), ``INTERCEPT_SD`` (the overall scale may be off by a factor ~e) and
``LAYOUT_SD`` (~20% unexplained per layout: interactions an additive correction
misses). Everything else is fitted from the study's own trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autotune.layout import Layout
from autotune.search._base import Observation, Predictor, Stop, Strategy
from autotune.search._simple import log_predictions

__all__ = ["ResidualStrategy", "expected_improvement"]

NUMERIC_AXES: tuple[str, ...] = ("tp", "pp", "dp", "micro_batch", "grad_accum")
CATEGORICAL_AXES: tuple[str, ...] = ("zero_stage", "recompute")
INTERCEPT_SD = 1.0
SLOPE_SD = 0.5
TREND_SD = 0.15
AXIS_SD = 0.3
LAYOUT_SD = 0.2
SEED_TRIALS = 4
"""Trials taken straight from the cost model's ranking before the residual model steers.
Settled by ``benchmarks/search_efficiency.py`` (docs/search.md): on the vTrain groups 4
seeds need as few trials as measuring in cost-model order alone (mean 2.44 vs 2.43;
1 seed: 2.63), and with the cost model deliberately perturbed (per-axis errors of 20% and
40%) they keep the residual model's robustness (worst group 11 and 13 trials, against 20
and 23 for cost-model order alone)."""


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI of maximising a Gaussian ``N(mu, sd^2)`` over ``best`` (Jones et al. 1998)."""
    z = (mu - best) / sd
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (mu - best) * cdf + sd * pdf


class _Features:
    """Residual features of a layout, each with its prior sd (see the module docstring).

    * an intercept: the model's overall scale error;
    * the centred log prediction: a calibration slope (cost models tend to exaggerate
      the spread between layouts, or to compress it);
    * ``log2`` of tp, pp, dp, micro-batch and grad-accum, centred: a trend per doubling
      of an axis that the model gets wrong (it generalises from mb=4 to mb=8);
    * one-hot ZeRO stage and recompute (categorical axes).

    Axes that do not vary among the candidates contribute nothing.
    """

    def __init__(self, candidates: Sequence[Layout], log_prior: dict[Layout, float]):
        self.numeric = [a for a in NUMERIC_AXES
                        if len({getattr(c, a) for c in candidates}) > 1]
        self.centre = {a: float(np.mean([math.log2(getattr(c, a)) for c in candidates]))
                       for a in self.numeric}
        prior = np.array(list(log_prior.values()))
        self.prior_centre = float(np.mean(prior)) if len(prior) else 0.0
        self.use_slope = bool(len(prior)) and float(np.ptp(prior)) > 0
        self.onehot = [(a, v) for a in CATEGORICAL_AXES
                       for v in sorted({getattr(c, a) for c in candidates}, key=str)
                       if len({getattr(c, a) for c in candidates}) > 1]
        sds = [INTERCEPT_SD] + ([SLOPE_SD] if self.use_slope else [])
        sds += [TREND_SD] * len(self.numeric) + [AXIS_SD] * len(self.onehot)
        self.width = len(sds)
        self.prior_precision = np.diag(1.0 / np.square(sds))
        self.log_prior = log_prior

    def matrix(self, layouts: Sequence[Layout]) -> np.ndarray:
        rows = []
        for lay in layouts:
            row = [1.0]
            if self.use_slope:
                row.append(self.log_prior.get(lay, self.prior_centre) - self.prior_centre)
            row += [math.log2(getattr(lay, a)) - self.centre[a] for a in self.numeric]
            row += [1.0 if getattr(lay, a) == v else 0.0 for a, v in self.onehot]
            rows.append(row)
        return np.array(rows, dtype=float).reshape(len(layouts), self.width)


class ResidualStrategy(Strategy):
    """Cost-model prior + Bayesian additive residual model + expected improvement."""

    name = "default"

    def __init__(self, *, seed: int = 0, predict: Predictor | None = None,
                 min_improvement: float | None = None) -> None:
        super().__init__(seed=seed)
        self._predict = predict
        self.min_improvement = min_improvement
        """Stop when the largest EI (a fraction of the best) is below this; ``None``: never."""
        self._prior: dict[Layout, float] = {}
        self._features: _Features | None = None

    def _setup(self, candidates: Sequence[Layout]) -> None:
        if self._features is None or any(c not in self._prior for c in candidates):
            self._prior = dict(zip(candidates, log_predictions(candidates, self._predict),
                                   strict=True))
            self._features = _Features(candidates, self._prior)

    def scores(self, free: Sequence[Layout], history: Sequence[Observation]
               ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of ``log(throughput)`` of each of ``free``."""
        assert self._features is not None
        feats = self._features
        ok = [o for o in history if o.status == "ok" and o.value and o.value > 0]
        prior_free = np.array([self._prior.get(lay, min(self._prior.values())) for lay in free])
        x_free = feats.matrix(free)
        precision = feats.prior_precision.copy()
        rhs = np.zeros(feats.width)
        if ok:
            x = feats.matrix([o.layout for o in ok])
            r = np.array([math.log(o.value) - self._prior.get(o.layout, 0.0)  # type: ignore[arg-type]
                          for o in ok])
            precision += x.T @ x / LAYOUT_SD**2
            rhs = x.T @ r / LAYOUT_SD**2
        cov = np.linalg.inv(precision)
        mean = prior_free + x_free @ (cov @ rhs)
        var = np.einsum("ij,jk,ik->i", x_free, cov, x_free) + LAYOUT_SD**2
        return mean, np.sqrt(var)

    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout | Stop:
        self._setup(candidates)
        values = [o.value for o in history if o.status == "ok" and o.value and o.value > 0]
        judged = sum(o.status in ("ok", "oom", "error") for o in history)
        if not values or judged < SEED_TRIALS:  # the cost model's favourites first
            return max(free, key=lambda lay: self._prior[lay])
        mean, sd = self.scores(free, history)
        ei = expected_improvement(mean, sd, math.log(max(values)))
        best = int(np.argmax(ei))
        # Only after the seeds and with a value to improve on (the branch above): before,
        # the residual model has too little to say that nothing better is left.
        if self.min_improvement is not None and ei[best] < self.min_improvement:
            return Stop(f"expected improvement {_percent(ei[best])} < "
                        f"{_percent(self.min_improvement)} after {judged} trials "
                        f"({len(free)} layouts untried)", judged=judged)
        return free[best]


def _percent(fraction: float) -> str:
    """``0.0031`` → ``0.31%``; ``0.01`` → ``1%``."""
    return f"{100.0 * float(fraction):.3g}%"
