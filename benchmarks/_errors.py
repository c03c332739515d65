"""Absolute error of the predicted throughput, and the coverage of its 90% band, per table.

What ``cost_model_accuracy.py`` reports beside the Spearman: over a table's measured-ok
rows, the median and the maximum of ``|predicted / measured - 1|`` (model TFLOPS per
device), and the share of rows whose measured value lies inside the band ``plan`` prints
(:func:`autotune.planning.band.tflops_bands`, each group taken as one study whose
candidates are its measured-ok layouts, before any trial). The same errors by parallelism
class (:func:`parallelism_class`: whether the layout has tensor and pipeline parallelism)
say which terms carry a table's bias: a class far from the others points at the terms only
it pays (the TP all-reduces, the bubble and the point-to-point sends), which an overall
median hides. Within the two classes with one model-parallel axis, the errors by that
axis' degree (:func:`degree_class`: ``tp2`` ... with pp 1, ``pp2`` ... with tp 1) say
whether the bias grows with the degree, as a term priced per rank of the group would, or
is one step from the data-parallel rows, as a fixed cost of having the axis would.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.landscape import LandscapeGroup
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.planning.band import tflops_bands

__all__ = ["GroupErrors", "TableErrors", "group_errors", "parallelism_class", "degree_class",
           "PARALLELISM_CLASSES", "print_tables"]

PARALLELISM_CLASSES = ("tp1-pp1", "tp>1-pp1", "tp1-pp>1", "tp>1-pp>1")
"""Every value of :func:`parallelism_class`, in the order the benchmark reports them."""


def parallelism_class(layout: Layout) -> str:
    """One of :data:`PARALLELISM_CLASSES`: which of the terms that only model parallelism
    pays the layout's step holds (TP all-reduces; bubble and sends).

    >>> parallelism_class(Layout(tp=2, pp=1, dp=4, micro_batch=1, grad_accum=1))
    'tp>1-pp1'
    """
    return f"tp{'>1' if layout.tp > 1 else '1'}-pp{'>1' if layout.pp > 1 else '1'}"


def degree_class(layout: Layout) -> str | None:
    """``tpN`` for a layout whose only model parallelism is tensor parallelism of degree
    ``N``, ``ppN`` for one whose only model parallelism is a pipeline of ``N`` stages;
    ``None`` for data parallelism alone and for both axes at once (their classes are
    :func:`parallelism_class`'s).

    >>> [degree_class(Layout(tp=t, pp=p, dp=1, micro_batch=1, grad_accum=1))
    ...  for t, p in ((4, 1), (1, 8), (1, 1), (2, 2))]
    ['tp4', 'pp8', None, None]
    """
    if (layout.tp > 1) == (layout.pp > 1):
        return None
    return f"tp{layout.tp}" if layout.tp > 1 else f"pp{layout.pp}"


def _degree_order(key: str) -> tuple[int, int]:
    """``tp`` degrees first, then ``pp`` depths, each ascending."""
    return (0 if key.startswith("tp") else 1, int(key[2:]))


def _summary(pct: list[float]) -> dict[str, Any]:
    return {"n_rows": len(pct), "median_pct_error": statistics.median(pct),
            "median_abs_pct_error": statistics.median(abs(x) for x in pct)}


@dataclass(frozen=True)
class GroupErrors:
    """Per measured-ok row of one group: the percentage error ``100 (predicted / measured
    - 1)`` (positive: optimistic) and whether the measured value is inside the band."""

    pct: list[float]
    inside: list[bool]
    width: list[float]
    """The band's high / low (a factor)."""
    classes: list[str] = field(default_factory=list)
    """Each row's :func:`parallelism_class`."""
    degrees: list[str | None] = field(default_factory=list)
    """Each row's :func:`degree_class`."""


def group_errors(group: LandscapeGroup) -> GroupErrors:
    """:class:`GroupErrors` of ``group``'s ok rows (empty when it has none)."""
    ok = [m for m in group.ok() if m.model_tflops_per_device]
    if not ok:
        return GroupErrors([], [], [], [], [])
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
    return GroupErrors(pct, inside, width, [parallelism_class(m.layout) for m in ok],
                       [degree_class(m.layout) for m in ok])


@dataclass
class TableErrors:
    """The rows of one file's groups, pooled."""

    path: str
    pct: list[float] = field(default_factory=list)
    inside: list[bool] = field(default_factory=list)
    width: list[float] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    degrees: list[str | None] = field(default_factory=list)

    def add(self, errors: GroupErrors) -> None:
        self.pct += errors.pct
        self.inside += errors.inside
        self.width += errors.width
        self.classes += errors.classes
        self.degrees += errors.degrees

    def by_class(self) -> dict[str, dict[str, Any]]:
        """Per :func:`parallelism_class` present, in :data:`PARALLELISM_CLASSES` order:
        ``n_rows``, ``median_pct_error`` (signed) and ``median_abs_pct_error``."""
        out: dict[str, dict[str, Any]] = {}
        for cls in PARALLELISM_CLASSES:
            pct = [x for x, c in zip(self.pct, self.classes, strict=True) if c == cls]
            if pct:
                out[cls] = _summary(pct)
        return out

    def by_degree(self) -> dict[str, dict[str, Any]]:
        """Per :func:`degree_class` present (``tp`` degrees, then ``pp`` depths, each
        ascending): the same three figures as :meth:`by_class`."""
        keys = sorted({d for d in self.degrees if d is not None}, key=_degree_order)
        return {key: _summary([x for x, d in zip(self.pct, self.degrees, strict=True)
                               if d == key]) for key in keys}

    def to_dict(self) -> dict[str, Any]:
        """``median_abs_pct_error``, ``max_abs_pct_error``, ``median_pct_error`` (signed,
        positive: too optimistic), ``predicted_high`` (rows predicted above their
        measured value), ``band_coverage`` (share inside the 90% band) and
        ``median_band_width`` (its high / low); ``by_parallelism``: :meth:`by_class`;
        ``by_degree``: :meth:`by_degree`."""
        n = len(self.pct)
        absolute = [abs(x) for x in self.pct]
        return {"path": self.path, "n_rows": n,
                "median_abs_pct_error": statistics.median(absolute) if n else None,
                "max_abs_pct_error": max(absolute) if n else None,
                "median_pct_error": statistics.median(self.pct) if n else None,
                "predicted_high": sum(x > 0 for x in self.pct),
                "band_coverage": sum(self.inside) / n if n else None,
                "median_band_width": statistics.median(self.width) if n else None,
                "by_parallelism": self.by_class(), "by_degree": self.by_degree()}


def print_tables(tables: list[TableErrors]) -> None:
    """One line per file with ok rows, then its rows by parallelism class, then those with
    one model-parallel axis by its degree."""
    print(f"\n{'table (all ok rows)':44s} {'rows':>5s} {'median |err|':>12s} "
          f"{'max |err|':>9s} {'median err':>10s} {'too high':>8s} {'in 90% band':>11s} "
          f"{'band width':>10s}")
    for t in (t.to_dict() for t in tables):
        if not t["n_rows"]:
            continue
        print(f"{Path(t['path']).name:44s} {t['n_rows']:5d} "
              f"{t['median_abs_pct_error']:11.1f}% {t['max_abs_pct_error']:8.1f}% "
              f"{t['median_pct_error']:+9.1f}% {t['predicted_high']:8d} "
              f"{t['band_coverage']:11.0%} {t['median_band_width']:10.2f}")
        for cls, c in t["by_parallelism"].items():
            print(f"  {cls:42s} {c['n_rows']:5d} {c['median_abs_pct_error']:11.1f}% "
                  f"{'':9s} {c['median_pct_error']:+9.1f}%")
        for key, c in t["by_degree"].items():
            alone = f"{key} (pp 1)" if key.startswith("tp") else f"{key} (tp 1)"
            print(f"    {alone:40s} {c['n_rows']:5d} {c['median_abs_pct_error']:11.1f}% "
                  f"{'':9s} {c['median_pct_error']:+9.1f}%")
