"""The strategies get the prediction and the probability of fitting apart (issue #13): the
default strategy's residuals are against the prediction alone, its acquisition (and the
cost-model order) is weighted by ``p_fit``, and earlier studies' residuals are its prior."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autotune.layout import Layout
from autotune.models.calibration import STUDY_CORRELATION, Residual
from autotune.search import Observation, make_strategy
from autotune.search._residual import SEED_TRIALS, ResidualStrategy

CANDIDATES = sorted(
    Layout(tp=tp, pp=1, dp=8 // tp, micro_batch=mb, grad_accum=16 // (8 // tp * mb),
           recompute=rc)
    for tp, mb, rc in itertools.product((1, 2, 4), (1, 2), ("none", "full")))


def predict(lay: Layout) -> float:
    return 100.0 * lay.micro_batch**0.3 / lay.tp**0.5 * (0.85 if lay.recompute == "full" else 1)


def test_residuals_are_against_the_prediction_alone() -> None:
    # Layouts that ran measured exactly their prediction; one of them was thought unlikely
    # to fit (p 0.2). Nothing is left to correct: every posterior mean is the prediction.
    unsure = CANDIDATES[0]
    p_fit = {lay: 0.2 if lay == unsure else 1.0 for lay in CANDIDATES}
    strategy = ResidualStrategy(seed=0, predict=predict, p_fit=p_fit.__getitem__)
    ran = [unsure, *CANDIDATES[1:SEED_TRIALS]]
    history = [Observation(lay, "ok", predict(lay)) for lay in ran]
    strategy.propose(CANDIDATES, history)
    free = [lay for lay in CANDIDATES if lay not in ran]
    mean, _ = strategy.scores(free, history)
    assert mean == pytest.approx([math.log(predict(lay)) for lay in free], abs=1e-9)


def test_the_acquisition_is_weighted_by_the_probability_of_fitting() -> None:
    ran = CANDIDATES[:SEED_TRIALS]
    history = [Observation(lay, "ok", predict(lay)) for lay in ran]
    free = [lay for lay in CANDIDATES if lay not in ran]
    plain = ResidualStrategy(seed=0, predict=predict).propose(CANDIDATES, history)
    assert plain in free
    # The layout it would measure is now unlikely to fit: another one is worth more.
    p_fit = {lay: 0.02 if lay == plain else 1.0 for lay in CANDIDATES}
    weighted = ResidualStrategy(seed=0, predict=predict, p_fit=p_fit.__getitem__)
    assert weighted.propose(CANDIDATES, history) not in (plain, None)


@pytest.mark.parametrize("name", ["default", "cost-model-only"])
def test_before_any_measurement_both_rank_by_expected_throughput(name: str) -> None:
    best = max(CANDIDATES, key=predict)
    assert make_strategy(name, seed=0, predict=predict).propose(CANDIDATES, []) == best
    p_fit = {lay: 0.3 if lay == best else 1.0 for lay in CANDIDATES}
    second = max((lay for lay in CANDIDATES if lay != best), key=predict)
    assert predict(best) * 0.3 < predict(second)
    chosen = make_strategy(name, seed=0, predict=predict, p_fit=p_fit.__getitem__)
    assert chosen.propose(CANDIDATES, []) == second


def test_earlier_studies_residuals_are_the_prior() -> None:
    # Earlier studies found full recompute 40% slower than predicted, the rest as predicted.
    warm = [Residual(lay, math.log(0.6 if lay.recompute == "full" else 1.0), 0.0)
            for lay in CANDIDATES for _ in range(3)]
    fresh = ResidualStrategy(seed=0, predict=predict)
    learned = ResidualStrategy(seed=0, predict=predict, warm_start=warm)
    fresh.propose(CANDIDATES, [])
    learned.propose(CANDIDATES, [])
    full = [lay for lay in CANDIDATES if lay.recompute == "full"]
    none = [lay for lay in CANDIDATES if lay.recompute == "none"]
    m_fresh, sd_fresh = fresh.scores(CANDIDATES, [])
    m_warm, sd_warm = learned.scores(CANDIDATES, [])
    shift = dict(zip(CANDIDATES, m_warm - m_fresh, strict=True))
    # Carried over at rho: about 0.9 * ln(0.6) for full recompute, about 0 otherwise.
    assert np.mean([shift[lay] for lay in full]) == pytest.approx(
        STUDY_CORRELATION * math.log(0.6), abs=0.05)
    assert max(abs(shift[lay]) for lay in none) < 0.05
    assert (sd_warm < sd_fresh).all()  # and surer
    # The seed order follows: a full-recompute favourite of the cost model drops.
    def favours_full(lay: Layout) -> float:
        return predict(lay) * (1.3 if lay.recompute == "full" else 1.0)

    assert make_strategy("default", seed=0, predict=favours_full).propose(
        CANDIDATES, []).recompute == "full"
    assert make_strategy("default", seed=0, predict=favours_full, warm_start=warm).propose(
        CANDIDATES, []).recompute == "none"


def test_a_measured_layout_outside_the_candidates_is_a_residual_of_its_own_prediction() -> None:
    # A resumed study with narrower axes (or a layout the calibration now excludes).
    outside = Layout(tp=8, pp=1, dp=1, micro_batch=1, grad_accum=16)
    history = [Observation(lay, "ok", predict(lay)) for lay in (*CANDIDATES[:3], outside)]
    strategy = ResidualStrategy(seed=0, predict=predict)
    strategy.propose(CANDIDATES, history)
    free = CANDIDATES[3:]
    mean, _ = strategy.scores(free, history)
    assert mean == pytest.approx([math.log(predict(lay)) for lay in free], abs=1e-9)
