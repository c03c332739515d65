"""The default strategy: the cost model's ranking, corrected by what the study measures.

The cost model is usually right about the shape of the landscape and wrong about a few
axes (a slow interconnect, a kernel that is faster at one micro-batch). So the strategy

1. measures :data:`SEED_TRIALS` seeds from the cost model first (its prediction corrected
   by the warm-start prior, below): the largest predicted throughput times the
   probability of fitting, then each time the layout that adds most to the seeds'
   expected best (:func:`~autotune.search._acquisition.seed_scores`: one predicted above
   every layout that ran, however doubtful its memory);
2. then fits, on the measured layouts only, a Bayesian linear model of the residual
   ``r = log(measured) - log(predicted)`` with a trend per doubling of each numeric axis
   (tp, pp, dp, micro-batch, grad-accum), one coefficient per categorical value (ZeRO
   stage, recompute=full, ...), a calibration slope and a shared intercept (the model's
   overall scale error; see :class:`_Features`). Its Gaussian prior shrinks every
   correction towards zero, so one measurement moves the layouts that share its axis
   values a little and the rest not at all (ridge regression = the posterior mean;
   Bishop 2006, section 3.3). The residual is against the prediction alone: a layout
   that ran did fit, whatever its probability of fitting was;
3. proposes the untried layout with the largest expected improvement (Jones et al. 1998)
   of ``log(predicted) + r`` over the best measured, under the posterior variance plus a
   per-layout term for what an additive correction cannot explain, times its
   probability of fitting (``p_fit``: an OOM improves nothing, so ``E[gain] = p_fit ·
   E[gain | it fits]``, fitting and throughput taken as independent), per expected
   second of the trial when the runner says what a trial costs (``cost``: an OOM costs
   its build, a layout that runs its steps too; :mod:`autotune.search._acquisition`);
4. skips layouts that need no less memory than a measured OOM;
5. optionally stops early: with ``min_improvement`` set, once
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
the prediction), ``INTERCEPT_SD`` (the overall scale: the published spread of step-time
models against measured runs, sd 0.185 of the log,
:mod:`autotune.models.prediction_spread`, on a device a published validation covers, eight
times that on another, ``scale_sd``; it is also the width of the band ``plan`` prints)
and ``LAYOUT_SD`` (~20% unexplained per layout: interactions an additive correction
misses). Everything else is fitted from the study's own trials, and, with a
warm start, from earlier studies': ``warm_start`` holds their residuals
(:class:`~autotune.models.calibration.Residual`, same device type, dtype and workload);
the same regression fitted on them from the generic prior gives a posterior that,
carried over (:func:`~autotune.models.evidence.carry_over_gaussian`: mean ``rho ·
m``, covariance ``rho^2 · S + (1 - rho^2) · prior``), is this study's prior
(docs/models.md, "Calibration from measurements").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autotune.layout import Layout
from autotune.models.calibration import Residual
from autotune.models.evidence import carry_over_gaussian, evidence_scale, gaussian_log_evidence
from autotune.models.prediction_spread import SCALE_SD, WIDEST_SCALE
from autotune.search._acquisition import TrialCost, gain_per_second, seed_scores
from autotune.search._base import (
    FitProbability,
    Observation,
    Predictor,
    Stop,
    Strategy,
    untried,
)
from autotune.search._simple import log_fit_probabilities, log_predictions

__all__ = ["ResidualStrategy", "expected_improvement"]

NUMERIC_AXES: tuple[str, ...] = ("tp", "pp", "dp", "micro_batch", "grad_accum", "ulysses")
CATEGORICAL_AXES: tuple[str, ...] = ("zero_stage", "recompute", "sequence_parallel",
                                     "zero_variant")
INTERCEPT_SD = SCALE_SD
INTERCEPT_SCALES: tuple[float, ...] = (1.0, 2.0, 4.0, WIDEST_SCALE)
"""Widths of the overall scale the trials may choose by their evidence, times the prior's
(``INTERCEPT_SD`` on a validated device): 1 (the published spread, the band before any
trial) up to 8 (sd 1.5, a model off by a factor of several on a device its kernel rates do
not describe). The scale never passes ``WIDEST_SCALE`` times ``INTERCEPT_SD``: a study on a
device no validation covers starts there (``scale_sd``,
:func:`autotune.models.prediction_spread.scale_sd`) and keeps that width, its trials
pinning the level."""
SLOPE_SD = 0.5
"""Prior sd of the calibration slope (per unit of centred log prediction): generic, not a
published figure. At the published spread (0.185) a cost model wrong per axis (
``search_efficiency.py --cost-model-error 0.3``) was found less often (96.2% against 97.3%
of runs): the slope is how the residual model absorbs such errors early."""
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
    * one-hot ZeRO stage, recompute and sequence parallelism (categorical axes).

    Axes that do not vary among the candidates contribute nothing.
    """

    def __init__(self, candidates: Sequence[Layout], log_prior: dict[Layout, float],
                 intercept_sd: float = INTERCEPT_SD):
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
        sds = [intercept_sd] + ([SLOPE_SD] if self.use_slope else [])
        sds += [TREND_SD] * len(self.numeric) + [AXIS_SD] * len(self.onehot)
        self.width = len(sds)
        self.shape = np.arange(self.width) > 0
        """The terms that can reorder layouts: all but the intercept (evidence_scale)."""
        self.prior_precision = np.diag(1.0 / np.square(sds))
        self.log_prior = log_prior
        self._rows: dict[Layout, list[float]] = {}
        """Each layout's row, once computed (log_prior is fixed for these features)."""

    def matrix(self, layouts: Sequence[Layout],
               slopes: Sequence[float] | None = None) -> np.ndarray:
        """One row per layout; ``slopes``: the centred log predictions where they are not
        this study's (another study's layouts, centred within it)."""
        rows = []
        for i, lay in enumerate(layouts):
            if slopes is None and (known := self._rows.get(lay)) is not None:
                rows.append(known)  # every proposal scores every untried layout again
                continue
            row = [1.0]
            if self.use_slope:
                row.append(slopes[i] if slopes is not None else
                           self.log_prior.get(lay, self.prior_centre) - self.prior_centre)
            row += [math.log2(getattr(lay, a)) - self.centre[a] for a in self.numeric]
            row += [1.0 if getattr(lay, a) == v else 0.0 for a, v in self.onehot]
            if slopes is None and lay in self.log_prior:  # its slope is final
                self._rows[lay] = row
            rows.append(row)
        return np.array(rows, dtype=float).reshape(len(layouts), self.width)


class ResidualStrategy(Strategy):
    """Cost-model prior + Bayesian additive residual model + expected improvement."""

    name = "default"

    def __init__(self, *, seed: int = 0, predict: Predictor | None = None,
                 p_fit: FitProbability | None = None, min_improvement: float | None = None,
                 warm_start: Sequence[Residual] = (), cost: TrialCost | None = None,
                 scale_sd: float = INTERCEPT_SD) -> None:
        super().__init__(seed=seed)
        self._scale_sd = scale_sd
        """Prior sd of the overall scale (:func:`~autotune.models.prediction_spread.scale_sd`
        of the study's device)."""
        self._scales = tuple(b for b in INTERCEPT_SCALES
                             if b * scale_sd <= WIDEST_SCALE * INTERCEPT_SD * (1 + 1e-9))
        """The scale's widths the trials may choose, times the prior's: never past the
        widest."""
        self._predict = predict
        self._p_fit = p_fit
        self._cost = cost
        """A trial's expected seconds (``None``: every trial costs the same)."""
        self.min_improvement = min_improvement
        """Stop when the largest EI (a fraction of the best) is below this; ``None``: never."""
        self._warm = tuple(warm_start) if predict is not None else ()
        """Earlier studies' residuals (meaningless without a cost model to be residuals of)."""
        self._prior: dict[Layout, float] = {}
        self._features: _Features | None = None
        self._prior_mean = np.zeros(0)
        self._prior_precision = np.zeros((0, 0))

    def _setup(self, candidates: Sequence[Layout], history: Sequence[Observation]) -> None:
        if self._features is None or any(c not in self._prior for c in candidates):
            self._prior = dict(zip(candidates, log_predictions(candidates, self._predict),
                                   strict=True))
            self._features = _Features(candidates, self._prior, self._scale_sd)
            self._prior_mean, self._prior_precision = self._coefficient_prior(self._features)
        # Measured layouts outside the candidates (a resumed study with other axes, or one
        # the memory calibration now excludes) are residuals against their own prediction.
        missing = list(dict.fromkeys(o.layout for o in history if o.layout not in self._prior))
        if missing:
            floor = min(self._prior.values()) - math.log(2.0)  # log_predictions' rule
            for lay in missing:
                self._prior[lay] = _log_prediction(self._predict, lay, floor)

    def _coefficient_prior(self, feats: _Features) -> tuple[np.ndarray, np.ndarray]:
        """Mean and precision of the residual coefficients before this study's trials: the
        generic prior, or the earlier studies' posterior carried over (module docstring)."""
        fresh = feats.prior_precision
        if not self._warm:
            return np.zeros(feats.width), fresh
        x = feats.matrix([w.layout for w in self._warm],
                         slopes=[w.log_prediction for w in self._warm])
        r = np.array([w.log_ratio for w in self._warm])
        cov = np.linalg.inv(fresh + x.T @ x / LAYOUT_SD**2)
        mean = cov @ (x.T @ r) / LAYOUT_SD**2
        mean, cov = carry_over_gaussian(mean, cov, np.linalg.inv(fresh))
        return mean, np.linalg.inv(cov)

    def scores(self, free: Sequence[Layout], history: Sequence[Observation]
               ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of ``log(throughput)`` of each of ``free`` (given that it
        runs: the probability of fitting is not in it)."""
        assert self._features is not None
        feats = self._features
        ok = [o for o in history if o.status == "ok" and o.value and o.value > 0]
        prior_free = np.array([self._prior.get(lay, min(self._prior.values())) for lay in free])
        x_free = feats.matrix(free)
        cov = np.linalg.inv(self._prior_precision)
        coef = self._prior_mean
        if ok:
            x = feats.matrix([o.layout for o in ok])
            r = np.array([math.log(o.value) - self._prior[o.layout]  # type: ignore[arg-type]
                          for o in ok])
            # The shape terms at the width the trials support (evidence_scale: at full
            # width, 2 trials' scatter became an axis trend that ranked worse than the
            # cost model), then the Gaussian posterior in covariance form (a width of 0
            # makes the prior singular): Bishop 2006, eqs. 3.49-3.51 via the Woodbury
            # identity, pushed through to the coefficients' space: the gain
            # cov·x'·(x·cov·x' + s·I_n)^-1 = (cov·x'x + s·I_p)^-1·cov·x', so nothing is
            # n x n (n trials: hundreds, against a few dozen coefficients).
            # First the overall scale's width, shape terms off: the intercept's prior is
            # the published spread of such models, and a device outside it (a stack well
            # below the kernel rates the model takes) shows as every trial off by one
            # factor, which must widen the scale, not turn on reordering terms.
            d = np.where(feats.shape, 1.0,
                         _intercept_width(x, r, coef, cov, feats.shape, self._scales))
            cov = d[:, None] * cov * d[None, :]
            scale = evidence_scale(x, r, coef, cov, feats.shape, LAYOUT_SD)
            d = np.where(feats.shape, scale, 1.0)
            cov, coef = d[:, None] * cov * d[None, :], d * coef
            gram = x.T @ x
            lhs = cov @ gram + LAYOUT_SD**2 * np.eye(len(coef))
            coef = coef + np.linalg.solve(lhs, cov @ (x.T @ r - gram @ coef))
            cov = cov - np.linalg.solve(lhs, cov @ gram @ cov)
        mean = prior_free + x_free @ coef
        var = np.einsum("ij,jk,ik->i", x_free, cov, x_free) + LAYOUT_SD**2
        return mean, np.sqrt(np.maximum(var, LAYOUT_SD**2))

    def posterior(self, candidates: Sequence[Layout], history: Sequence[Observation],
                  layouts: Sequence[Layout]) -> tuple[np.ndarray, np.ndarray]:
        """The cost model as calibrated by ``history``: :meth:`scores` of ``layouts`` with
        the residual model fitted on the ``ok`` trials of ``history`` alone, over the
        study's ``candidates`` (plan order), as a proposal after that history weighs them.
        During the seed trials the proposals still follow the prior; this is what the
        study has learned by then all the same (``benchmarks/cost_model_accuracy.py``
        ranks with it: its ``online`` row)."""
        self._setup(candidates, history)
        return self.scores(layouts, history)

    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout | Stop:
        score, ei, judged = self._scored(free, candidates, history)
        return self._pick(free, score, ei, judged, np.ones(len(free), dtype=bool))

    def propose_sequence(self, candidates: Sequence[Layout], history: Sequence[Observation],
                         k: int) -> list[Layout]:
        """:meth:`Strategy.propose_sequence` from one posterior: a pending layout changes
        neither the fit (only ``ok`` trials enter it) nor any other layout's score, so the
        ``i``-th proposal with the earlier ones pending is the best of the rest, the stop
        judged on the rest's largest EI as :meth:`propose` would: the untried layouts are
        scored once, not again for each proposal of the spread."""
        self.stop = None
        free = untried(candidates, history, skip_oom_dominated=self.skip_oom_dominated)
        if not free:
            return []
        score, ei, judged = self._scored(free, candidates, history)
        left, out = np.ones(len(free), dtype=bool), list[Layout]()
        while len(out) < k and left.any():
            choice = self._pick(free, score, ei, judged, left)
            if isinstance(choice, Stop):
                self.stop = choice
                break
            out.append(choice)
            left[free.index(choice)] = False
        return out

    def _scored(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Each of ``free``'s acquisition score (the proposal is its argmax), its EI (after
        the seed trials: the stop's bar is on the largest; ``None`` before) and how many
        trials are judged."""
        self._setup(candidates, history)
        log_p = np.array(log_fit_probabilities(free, self._p_fit))
        values = [o.value for o in history if o.status == "ok" and o.value and o.value > 0]
        judged = sum(o.status in ("ok", "oom", "error") for o in history)
        if not values or judged < SEED_TRIALS:
            # The cost model's favourites first (corrected by a warm start, not yet by this
            # study's trials): the one that adds most to the seeds' expected best
            # (seed_scores); argmax keeps the first of ties.
            mean, _ = self.scores(free, [])
            ran = [o.layout for o in history if o.status == "ok"]
            best_ran = float(np.max(self.scores(ran, [])[0])) if ran else None
            return seed_scores(mean, log_p, best_ran), None, judged
        mean, sd = self.scores(free, history)
        p_fit = np.exp(log_p)
        ei_if_fits = expected_improvement(mean, sd, math.log(max(values)))
        ei = ei_if_fits * p_fit
        secs = [self._cost(lay) for lay in free] if self._cost is not None else []
        if not secs or any(c is None for c in secs):
            return ei, ei, judged
        log_pred = np.array([self._prior[lay] for lay in free])
        return gain_per_second(
            ei_if_fits, p_fit, np.array([c.build_s for c in secs if c is not None]),
            np.array([c.steps_s for c in secs if c is not None]),
            np.exp(mean - log_pred)), ei, judged

    def _pick(self, free: list[Layout], score: np.ndarray, ei: np.ndarray | None, judged: int,
              left: np.ndarray) -> Layout | Stop:
        """The best of ``free`` still ``left`` (the first of ties), or the stop."""
        # Only after the seeds and with a value to improve on (ei is None before): before,
        # the residual model has too little to say that nothing better is left. The bar is
        # the largest EI, whatever the trials cost: "nothing left is worth 1%".
        if ei is not None and self.min_improvement is not None:
            top = float(ei[left].max())
            if top < self.min_improvement:
                return Stop(f"expected improvement {_percent(top)} < "
                            f"{_percent(self.min_improvement)} after {judged} trials "
                            f"({int(left.sum())} layouts untried)", judged=judged)
        index = np.flatnonzero(left)
        return free[int(index[int(np.argmax(score[left]))])]


def _intercept_width(x: np.ndarray, r: np.ndarray, coef: np.ndarray, cov: np.ndarray,
                     shape: np.ndarray, scales: Sequence[float] = INTERCEPT_SCALES) -> float:
    """The factor of ``scales`` (:data:`INTERCEPT_SCALES`) on the overall scale's sd of largest
    evidence (:func:`~autotune.models.evidence.gaussian_log_evidence`), the shape
    terms held off; the mean stays (a warm start's learned offset is not widened); ties
    go to the narrower (Occam, as :func:`~autotune.models.evidence.evidence_scale`)."""
    mean = np.where(shape, 0.0, coef)
    best, best_log_ml = 1.0, -math.inf
    for b in sorted(scales):
        d = np.where(shape, 0.0, b)
        log_ml = gaussian_log_evidence(x, r, mean, d[:, None] * cov * d[None, :], LAYOUT_SD)
        if log_ml is not None and log_ml > best_log_ml + 1e-9:
            best, best_log_ml = b, log_ml
    return best


def _log_prediction(predict: Predictor | None, layout: Layout, floor: float) -> float:
    """``log(predict(layout))``; 0 without a model, ``floor`` where it refuses the layout."""
    if predict is None:
        return 0.0
    try:
        p = float(predict(layout))
    except (ArithmeticError, ValueError):
        return floor
    return math.log(p) if p > 0 and math.isfinite(p) else floor


def _percent(fraction: float) -> str:
    """``0.0031`` → ``0.31%``; ``0.01`` → ``1%``."""
    return f"{100.0 * float(fraction):.3g}%"
