"""The 90% band of a predicted throughput: the default strategy's residual posterior.

The search (:class:`autotune.search._residual.ResidualStrategy`) treats the cost model's
prediction as the prior mean of ``log(throughput)`` and carries a Gaussian over the
residual ``log(measured) - log(predicted)``. Before any trial that posterior is its prior
(or, with a warm start, the earlier studies' posterior carried over); after trials it is
the fitted one. The band ``plan`` prints is that posterior's central 90% interval
(``exp(mean +- 1.645 sd)``), so the band and what the search believes are the same
numbers: a band that is too narrow would make the search too sure, and the other way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from autotune.layout import Layout
from autotune.models.calibration import Residual
from autotune.models.prediction_spread import SCALE_SD, VALIDATED_DEVICES, scale_sd
from autotune.search._base import Observation
from autotune.search._residual import (
    AXIS_SD,
    CATEGORICAL_AXES,
    LAYOUT_SD,
    NUMERIC_AXES,
    SLOPE_SD,
    TREND_SD,
    ResidualStrategy,
)

__all__ = ["BAND_Z", "Band", "ratio_band", "tflops_bands", "unvalidated_band_note"]

BAND_Z = 1.6448536269514722
"""The standard normal's 95th percentile: a central 90% interval."""

Band = tuple[float, float]
"""(low, high) model TFLOPS per device."""


def tflops_bands(predicted: Mapping[Layout, float], *, layouts: Sequence[Layout] | None = None,
                 history: Sequence[Observation] = (),
                 warm_start: Sequence[Residual] = (), device: str | None = None,
                 ceiling: float | None = None) -> dict[Layout, Band]:
    """The 90% band of each of ``layouts`` (default: every key of ``predicted``), whose
    cost-model predictions are ``predicted`` (model TFLOPS per device, all candidates of
    the study, in plan order), given the study's ``history`` and ``warm_start``, on
    ``device`` (a hardware-table name: the overall scale's prior width,
    :func:`~autotune.models.prediction_spread.scale_sd`; ``None``: the published spread).
    ``ceiling``: the device's peak TFLOPS for the study's dtype, where published: no
    layout's model TFLOPS can pass it (model FLOPs are at most the hardware FLOPs a step
    runs, and those at most peak times the step's time), so the band's upper end stops
    there; the posterior itself is not changed."""
    candidates = list(predicted)
    wanted = list(layouts) if layouts is not None else candidates
    strategy = ResidualStrategy(predict=lambda lay: predicted[lay], warm_start=warm_start,
                                scale_sd=SCALE_SD if device is None else scale_sd(device))
    mean, sd = strategy.posterior(candidates, history, wanted)
    top = math.inf if ceiling is None else ceiling
    return {lay: (min(math.exp(m - BAND_Z * s), top), min(math.exp(m + BAND_Z * s), top))
            for lay, m, s in zip(wanted, mean.tolist(), sd.tolist(), strict=True)}


def ratio_band(base: tuple[Layout, float], other: tuple[Layout, float]) -> Band:
    """90% band of ``other``'s throughput over ``base``'s (a scaling efficiency before
    any trial), each given as (layout, cost-model prediction), under the residual prior
    of :class:`~autotune.search._residual.ResidualStrategy`: the shared intercept (the
    model's overall scale) cancels in the ratio; what remains is the trend per doubling
    of each numeric axis the two layouts differ in (``TREND_SD`` per doubling), each
    categorical axis they differ in (one-hot: ``2 AXIS_SD^2``), the calibration slope on
    the log-prediction difference (``SLOPE_SD``) and the two layouts' own terms
    (``2 LAYOUT_SD^2``), taken as independent."""
    (lay_a, pred_a), (lay_b, pred_b) = base, other
    var = 2 * LAYOUT_SD**2 + (SLOPE_SD * math.log(pred_b / pred_a)) ** 2
    var += sum((TREND_SD * math.log2(getattr(lay_b, a) / getattr(lay_a, a))) ** 2
               for a in NUMERIC_AXES)
    var += sum(2 * AXIS_SD**2 for a in CATEGORICAL_AXES
               if getattr(lay_a, a) != getattr(lay_b, a))
    ratio, spread = pred_b / pred_a, math.exp(BAND_Z * math.sqrt(var))
    return ratio / spread, ratio * spread


def unvalidated_band_note(device: str) -> str | None:
    """Why a band on ``device`` is wide, for a header line, where no published validation
    of a step-time model covers it (``None`` where one does): its overall scale is the
    widest the residual model takes (:func:`~autotune.models.prediction_spread.scale_sd`),
    whose own 90% range is a factor ``exp(1.645 sd)`` either way; the scale is shared by
    every layout, so the ranking does not depend on it.

    >>> unvalidated_band_note("a100-80gb") is None, unvalidated_band_note("cpu")[:39]
    (True, '90% band: no published validation of a ')
    """
    if device in VALIDATED_DEVICES:
        return None
    scale = math.exp(BAND_Z * scale_sd(device))
    return (f"90% band: no published validation of a step-time model covers {device}, so "
            f"the band lets the cost model's overall level be off by a factor of {scale:.0f} "
            "either way (docs/models.md, \"A device no validation covers\"); the ranking "
            "does not depend on it, and the study's first trials narrow it")
