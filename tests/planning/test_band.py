"""The 90% band of a predicted throughput is the search's residual posterior."""

from __future__ import annotations

import math

import pytest

from autotune.layout import Layout
from autotune.planning.band import BAND_Z, tflops_bands
from autotune.search._base import Observation
from autotune.search._residual import ResidualStrategy

LAYOUTS = [Layout(tp=t, pp=p, dp=8 // (t * p), micro_batch=1, grad_accum=8)
           for t in (1, 2, 4) for p in (1, 2)]
PREDICTED = {lay: 100.0 / (lay.tp * lay.pp) ** 0.3 for lay in LAYOUTS}


def test_band_holds_the_prediction_and_is_the_posterior_interval() -> None:
    bands = tflops_bands(PREDICTED)
    mean, sd = ResidualStrategy(predict=PREDICTED.__getitem__).posterior(
        LAYOUTS, [], LAYOUTS)
    for lay, m, s in zip(LAYOUTS, mean, sd, strict=True):
        lo, hi = bands[lay]
        assert lo < PREDICTED[lay] < hi
        assert math.log(hi) - math.log(lo) == pytest.approx(2 * BAND_Z * s)
        assert math.sqrt(lo * hi) == pytest.approx(math.exp(m))


def test_a_measured_trial_moves_and_narrows_the_band() -> None:
    before = tflops_bands(PREDICTED)
    measured = LAYOUTS[0]
    history = [Observation(measured, "ok", PREDICTED[measured] / 2)]
    after = tflops_bands(PREDICTED, history=history)
    for lay in LAYOUTS:
        assert after[lay][1] / after[lay][0] < before[lay][1] / before[lay][0]
    # The model was twice too optimistic there: the band of every layout moves down.
    assert math.sqrt(after[measured][0] * after[measured][1]) < PREDICTED[measured]
