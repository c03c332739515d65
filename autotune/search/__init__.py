"""Search strategies: which layout to measure next.

A :class:`Strategy` gets the candidate layouts (the feasible space, in plan order:
:func:`plan_order`) and the history of what was measured, and returns the next layout or
``None`` (nothing left, or an early :class:`Stop` in ``strategy.stop``). The study runner
(:mod:`autotune.runner.study`) enqueues what it proposes into the real Optuna study; the
benchmark (``benchmarks/search_efficiency.py``) drives the very same objects. See
``docs/search.md``.

>>> from autotune.layout import Layout
>>> cands = [Layout(tp=t, pp=1, dp=4 // t, micro_batch=1, grad_accum=t) for t in (1, 2, 4)]
>>> strategy = make_strategy("cost-model-only", seed=0, predict=lambda lay: lay.tp)
>>> strategy.propose(cands, []).tp
4
>>> strategy.propose(cands, [Observation(cands[2], "ok", 10.0)]).tp
2
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.config.study import STRATEGIES, check_min_improvement
from autotune.errors import SpecError
from autotune.models.calibration import Residual
from autotune.models.prediction_spread import SCALE_SD
from autotune.search._acquisition import TrialCost, TrialSeconds, gain_per_second
from autotune.search._base import (
    FitProbability,
    Observation,
    Predictor,
    Stop,
    Strategy,
    dominated_by_oom,
    needs_no_less_memory,
    plan_order,
    untried,
)
from autotune.search._residual import ResidualStrategy
from autotune.search._seeding import cost_model_predictor
from autotune.search._simple import CostModelOnlyStrategy, GridStrategy, RandomStrategy

__all__ = ["STRATEGIES", "Observation", "Predictor", "FitProbability", "Stop", "Strategy",
           "make_strategy", "dominated_by_oom", "needs_no_less_memory", "untried", "plan_order",
           "axis_distributions", "layout_from_params", "cost_model_predictor",
           "ResidualStrategy", "CostModelOnlyStrategy", "GridStrategy", "RandomStrategy",
           "OptunaSamplerStrategy", "TrialCost", "TrialSeconds", "gain_per_second"]

_OPTUNA_NAMES = ("STARTUP_TRIALS", "OptunaSamplerStrategy", "axis_distributions",
                 "layout_from_params")
"""Loaded from :mod:`autotune.search._optuna` when first asked for: Optuna's ~0.2 s of
imports are the samplers' and the study runner's, not ``autotune plan``'s (which ranks
with this package's residual model; docs/guide.md, its 2 s of CPU)."""


def __getattr__(name: str) -> Any:
    if name in _OPTUNA_NAMES:
        from autotune.search import _optuna

        return getattr(_optuna, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tpe(seed: int):
    import optuna

    from autotune.search._optuna import STARTUP_TRIALS

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS,
                                      multivariate=True)


def _gp(seed: int):
    import optuna

    from autotune.search._optuna import STARTUP_TRIALS

    try:
        import scipy  # noqa: F401  (GPSampler needs it; not a core dependency)
    except ImportError:
        raise SpecError("search.strategy", "gp",
                        "the 'gp' strategy needs scipy (pip install scipy)") from None
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=STARTUP_TRIALS,
                                     deterministic_objective=False)


def make_strategy(name: str, *, seed: int, predict: Predictor | None = None,
                  p_fit: FitProbability | None = None, min_improvement: float | None = None,
                  warm_start: Sequence[Residual] = (), cost: TrialCost | None = None,
                  scale_sd: float = SCALE_SD) -> Strategy:
    """A fresh strategy for one study. ``predict`` is the cost model's predicted throughput
    of a layout; ``cost-model-only`` needs it, ``default`` uses it when given. ``p_fit``:
    each candidate's probability of fitting the device (``None``: all fit); the two rank by
    expected throughput, prediction times ``p_fit``, and ``default`` learns its residuals
    against the prediction alone. ``warm_start``: earlier studies' throughput residuals,
    the prior of ``default``'s residual model (:mod:`autotune.models.calibration`).
    ``random``, ``grid``, ``tpe`` and ``gp`` use neither: baselines, and samplers that
    learn from the OOMs they are told. ``min_improvement`` (``search.min_improvement``):
    only ``default`` has an expected improvement to compare with it; the others refuse it
    rather than ignore it. ``cost``: a trial's expected seconds (an OOM: its build);
    ``default`` then ranks by constrained EI per expected second
    (:mod:`autotune.search._acquisition`). ``scale_sd``: the prior sd of ``default``'s
    overall scale, :func:`autotune.models.prediction_spread.scale_sd` of the study's
    device (default: the published spread)."""
    if min_improvement is not None:
        min_improvement = check_min_improvement(min_improvement, name)
    if name == "default":
        return ResidualStrategy(seed=seed, predict=predict, p_fit=p_fit,
                                min_improvement=min_improvement, warm_start=warm_start,
                                cost=cost, scale_sd=scale_sd)
    if name == "cost-model-only":
        if predict is None:
            raise SpecError("search.strategy", name, "needs a cost model (predict)")
        return CostModelOnlyStrategy(seed=seed, predict=predict, p_fit=p_fit)
    if name == "random":
        return RandomStrategy(seed=seed)
    if name == "grid":
        return GridStrategy(seed=seed)
    if name in ("tpe", "gp"):
        from autotune.search._optuna import OptunaSamplerStrategy

        return OptunaSamplerStrategy(name, _tpe if name == "tpe" else _gp, seed=seed)
    raise SpecError("search.strategy", name, f"allowed: one of {', '.join(STRATEGIES)}")
