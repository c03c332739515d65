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


def test_ratio_band_has_no_overall_scale_and_widens_with_the_axes_that_differ() -> None:
    from autotune.planning.band import ratio_band
    from autotune.search._residual import LAYOUT_SD, SLOPE_SD, TREND_SD

    a = Layout(tp=2, pp=4, dp=2, micro_batch=1, grad_accum=8)
    lo, hi = ratio_band((a, 100.0), (a, 100.0))
    assert math.log(hi / lo) == pytest.approx(2 * BAND_Z * math.sqrt(2) * LAYOUT_SD)
    b = Layout(tp=2, pp=4, dp=16, micro_batch=1, grad_accum=8)
    lo8, hi8 = ratio_band((a, 100.0), (b, 90.0))
    assert lo8 < 0.9 < hi8 and hi8 / lo8 > hi / lo
    expected = math.sqrt(2 * LAYOUT_SD**2 + (3 * TREND_SD) ** 2 + (SLOPE_SD * math.log(0.9)) ** 2)
    assert math.log(hi8 / lo8) == pytest.approx(2 * BAND_Z * expected)


def test_the_band_before_a_trial_is_the_published_spread_and_widens_on_a_far_offset() -> None:
    from autotune.models.prediction_spread import SCALE_SD
    from autotune.search._residual import LAYOUT_SD

    lo, hi = tflops_bands({LAYOUTS[0]: 100.0})[LAYOUTS[0]]  # no axis varies: no trends
    sd = math.sqrt(SCALE_SD**2 + LAYOUT_SD**2)
    assert math.log(hi / lo) == pytest.approx(2 * BAND_Z * sd, rel=1e-6)
    flat = {lay: 100.0 for lay in LAYOUTS}
    # Every trial 3x below: far outside a sd of 0.185, so the evidence widens the scale and
    # the untried layouts' band centre follows the trials nearly all the way.
    history = [Observation(lay, "ok", 100.0 / 3) for lay in LAYOUTS[:3]]
    after = tflops_bands(flat, history=history)
    centre = math.sqrt(after[LAYOUTS[5]][0] * after[LAYOUTS[5]][1])
    assert 100.0 / 3 < centre < 100.0 / 2.5
    # Within the published spread the scale keeps its width: shrunk towards the model.
    near = [Observation(lay, "ok", 100.0 / 1.1) for lay in LAYOUTS[:3]]
    kept = tflops_bands(flat, history=near)
    precision = 1 / SCALE_SD**2 + 3 / LAYOUT_SD**2
    shrunk = 100.0 * math.exp(-3 * math.log(1.1) / LAYOUT_SD**2 / precision)
    assert math.sqrt(kept[LAYOUTS[5]][0] * kept[LAYOUTS[5]][1]) == pytest.approx(shrunk)


def test_a_calibrated_plan_bands_with_the_earlier_studies_as_the_search_would() -> None:
    from autotune.models.calibration import Calibration, CalibrationKey, Residual
    from autotune.planning.plan import plan_study
    from autotune.spec import load_study

    spec = load_study("studies/cpu_demo.yaml")
    fresh = plan_study(spec, top=3)
    top = [row.layout for row in fresh.rows]
    # Earlier studies measured the top layout at half its prediction.
    earlier = tuple(Residual(top[0], math.log(0.5), 0.0) for _ in range(5))
    cal = Calibration(CalibrationKey("cpu", spec.training.dtype), residuals=earlier)
    warm = plan_study(spec, top=3, calibration=cal)
    for row, before in zip(warm.rows, fresh.rows, strict=True):
        assert row.layout == before.layout  # the ranking is the cost model's either way
        assert row.tflops_band is not None and before.tflops_band is not None
        assert row.tflops_band[1] < before.tflops_band[1]  # the warm posterior: lower


def test_a_plan_after_the_study_s_own_trials_bands_with_them_as_the_search_would() -> None:
    """The search's posterior after a study's trials is fitted on them (its history), so
    ``plan`` on that study bands with them too: the CPU demo (no published validation:
    the widest scale) measured at a third of its prediction, three times."""
    from autotune.models.calibration import Calibration, CalibrationKey, LogCorrection
    from autotune.planning.plan import plan_study, render_plan
    from autotune.spec import load_study

    spec = load_study("studies/cpu_demo.yaml")
    fresh = plan_study(spec, top=6)
    runs = tuple((row.layout, row.step.model_tflops_per_device / 3) for row in fresh.rows[:3])
    key = CalibrationKey("cpu", spec.training.dtype)
    # a database with no throughput measured: the prior's band, and the note says why
    empty = plan_study(spec, top=6, calibration=Calibration(key))
    assert [r.tflops_band for r in empty.rows] == [r.tflops_band for r in fresh.rows]
    assert "90% band: no published validation" in render_plan(empty, "table")
    own = Calibration(key, throughput=LogCorrection(math.log(1 / 3), 0.05, 3), own=3,
                      runs=runs)
    after = plan_study(spec, top=6, calibration=own)
    for row, before in zip(after.rows, fresh.rows, strict=True):
        assert row.layout == before.layout  # the ranking is the cost model's either way
        assert row.tflops_band is not None and before.tflops_band is not None
        low, high = row.tflops_band
        predicted = row.step.model_tflops_per_device
        assert 0.25 * predicted < math.sqrt(low * high) < 0.45 * predicted  # the trials'
        assert high / low < (before.tflops_band[1] / before.tflops_band[0]) ** 0.5
    for (layout, measured), row in zip(runs, after.rows, strict=False):
        assert row.layout == layout and row.tflops_band is not None
        assert row.tflops_band[0] < measured < row.tflops_band[1]
    assert "90% band: no published validation" not in render_plan(after, "table")


def test_a_device_no_validation_covers_starts_at_the_widest_scale_and_its_trials_pin_it(
        ) -> None:
    """The published spread (sd 0.185) is of models validated on A100 and Hopper systems;
    on a Max 1550 the band before any trial is the widest scale the residual model takes,
    and a few trials bring the untried layouts' band back to the trials' level, narrow."""
    from autotune.models.prediction_spread import SCALE_SD, WIDEST_SCALE, scale_sd
    from autotune.search._residual import LAYOUT_SD

    assert scale_sd("a100-80gb") == scale_sd("h200") == SCALE_SD
    assert scale_sd("max1550-tile") == scale_sd("cpu") == pytest.approx(SCALE_SD * WIDEST_SCALE)
    one = {LAYOUTS[0]: 100.0}
    assert tflops_bands(one, device="a100-80gb") == tflops_bands(one)  # unchanged
    lo, hi = tflops_bands(one, device="max1550-tile")[LAYOUTS[0]]
    sd = math.sqrt((SCALE_SD * WIDEST_SCALE) ** 2 + LAYOUT_SD**2)
    assert math.log(hi / lo) == pytest.approx(2 * BAND_Z * sd, rel=1e-6)
    assert lo < 100.0 / 10 and hi > 100.0 * 10  # a level 2-5x off (ALCF, LRZ) is inside
    # Three trials 3x below: the level is the trials', the band a few times narrower.
    flat = {lay: 100.0 for lay in LAYOUTS}
    history = [Observation(lay, "ok", 100.0 / 3) for lay in LAYOUTS[:3]]
    after = tflops_bands(flat, history=history, device="max1550-tile")
    low, high = after[LAYOUTS[5]]
    assert 100.0 / 3.2 < math.sqrt(low * high) < 100.0 / 2.8
    assert high / low < (hi / lo) ** 0.5


def test_the_search_on_a_device_no_validation_covers_keeps_the_widest_scale() -> None:
    """The evidence may widen a validated device's scale up to the widest, never past it:
    a study that starts there keeps that width (its trials pin the level instead)."""
    from autotune.models.prediction_spread import SCALE_SD, WIDEST_SCALE
    from autotune.search._residual import INTERCEPT_SCALES

    wide = ResidualStrategy(predict=PREDICTED.__getitem__, scale_sd=SCALE_SD * WIDEST_SCALE)
    narrow = ResidualStrategy(predict=PREDICTED.__getitem__)
    assert wide._scales == (1.0,) and narrow._scales == INTERCEPT_SCALES
