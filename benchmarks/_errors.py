"""Absolute error of the predicted throughput, and the coverage of its 90% band, per table.

What ``cost_model_accuracy.py`` reports beside the Spearman: over a table's measured-ok
rows, the median and the maximum of ``|predicted / measured - 1|`` (model TFLOPS per
device), and the share of rows whose measured value lies inside the band ``plan`` prints
(:func:`autotune.planning.band.tflops_bands`, each group taken as one study whose
candidates are its measured-ok layouts, before any trial).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from autotune.landscape import LandscapeGroup
from autotune.models.cost import estimate_step
from autotune.planning.band import tflops_bands

__all__ = ["GroupErrors", "TableErrors", "group_errors"]


@dataclass(frozen=True)
class GroupErrors:
    """Per measured-ok row of one group: the percentage error ``100 (predicted / measured
    - 1)`` (positive: optimistic) and whether the measured value is inside the band."""

    pct: list[float]
    inside: list[bool]
    width: list[float]
    """The band's high / low (a factor)."""


def group_errors(group: LandscapeGroup) -> GroupErrors:
    """:class:`GroupErrors` of ``group``'s ok rows (empty when it has none)."""
    ok = [m for m in group.ok() if m.model_tflops_per_device]
    if not ok:
        return GroupErrors([], [], [])
    predicted = {m.layout: estimate_step(group.model, m.layout, group.cluster, stack=group.stack,
                                         dtype=group.dtype).model_tflops_per_device
                 for m in ok}
    bands = tflops_bands(predicted, device=group.cluster.device,
                         ceiling=group.cluster.device_spec().peak_tflops(group.dtype))
    pct, inside, width = [], [], []
    for m in ok:
        measured = float(m.model_tflops_per_device or 0.0)
        pct.append(100.0 * (predicted[m.layout] / measured - 1.0))
        lo, hi = bands[m.layout]
        inside.append(lo <= measured <= hi)
        width.append(hi / lo)
    return GroupErrors(pct, inside, width)


@dataclass
class TableErrors:
    """The rows of one file's groups, pooled."""

    path: str
    pct: list[float] = field(default_factory=list)
    inside: list[bool] = field(default_factory=list)
    width: list[float] = field(default_factory=list)

    def add(self, errors: GroupErrors) -> None:
        self.pct += errors.pct
        self.inside += errors.inside
        self.width += errors.width

    def to_dict(self) -> dict[str, Any]:
        """``median_abs_pct_error``, ``max_abs_pct_error``, ``median_pct_error`` (signed,
        positive: too optimistic), ``predicted_high`` (rows predicted above their
        measured value), ``band_coverage`` (share inside the 90% band) and
        ``median_band_width`` (its high / low)."""
        n = len(self.pct)
        absolute = [abs(x) for x in self.pct]
        return {"path": self.path, "n_rows": n,
                "median_abs_pct_error": statistics.median(absolute) if n else None,
                "max_abs_pct_error": max(absolute) if n else None,
                "median_pct_error": statistics.median(self.pct) if n else None,
                "predicted_high": sum(x > 0 for x in self.pct),
                "band_coverage": sum(self.inside) / n if n else None,
                "median_band_width": statistics.median(self.width) if n else None}
