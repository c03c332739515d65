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
from autotune.search._base import Observation
from autotune.search._residual import ResidualStrategy

__all__ = ["BAND_Z", "Band", "tflops_bands"]

BAND_Z = 1.6448536269514722
"""The standard normal's 95th percentile: a central 90% interval."""

Band = tuple[float, float]
"""(low, high) model TFLOPS per device."""


def tflops_bands(predicted: Mapping[Layout, float], *, layouts: Sequence[Layout] | None = None,
                 history: Sequence[Observation] = (),
                 warm_start: Sequence[Residual] = ()) -> dict[Layout, Band]:
    """The 90% band of each of ``layouts`` (default: every key of ``predicted``), whose
    cost-model predictions are ``predicted`` (model TFLOPS per device, all candidates of
    the study, in plan order), given the study's ``history`` and ``warm_start``."""
    candidates = list(predicted)
    wanted = list(layouts) if layouts is not None else candidates
    strategy = ResidualStrategy(predict=lambda lay: predicted[lay], warm_start=warm_start)
    mean, sd = strategy.posterior(candidates, history, wanted)
    return {lay: (math.exp(m - BAND_Z * s), math.exp(m + BAND_Z * s))
            for lay, m, s in zip(wanted, mean.tolist(), sd.tolist(), strict=True)}
