"""The scaling plot: model TFLOPS per device and efficiency over the sizes, measured
points beside the predicted curve and its 95% band (matplotlib's object API on Agg, as
:mod:`autotune.report.plots`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from autotune.scaling.sizes import ScalingRequest
from autotune.scaling.table import ScalingRow
from autotune.util.atomic import atomic_path

__all__ = ["scaling_plot"]


def scaling_plot(rows: Sequence[ScalingRow], request: ScalingRequest, path: Path,
                 *, title: str = "") -> None:
    """Write the two-panel PNG to ``path`` (atomically)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2)
    for ax, value, low, high, label in (
            (left, "model_tflops_per_device", "tflops_low", "tflops_high",
             "model TFLOPS / device"),
            (right, "efficiency", "efficiency_low", "efficiency_high",
             f"{request.mode} scaling efficiency")):
        pred = [r for r in rows if r.source == "predicted" and getattr(r, value) is not None]
        meas = [r for r in rows if r.source == "measured" and getattr(r, value) is not None]
        if pred:
            ax.plot([r.size for r in pred], [getattr(r, value) for r in pred], "--",
                    marker="x", color="#1565c0", label="predicted")
            banded = [r for r in pred if getattr(r, low) is not None]
            if banded:
                ax.fill_between([r.size for r in banded], [getattr(r, low) for r in banded],
                                [getattr(r, high) for r in banded], color="#1565c0",
                                alpha=0.15, label="95% interval")
        if meas:
            ax.plot([r.size for r in meas], [getattr(r, value) for r in meas], "-",
                    marker="o", color="#2e7d32", label="measured")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(request.sizes), [str(s) for s in request.sizes])
        ax.set_xlabel(request.axis)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    right.axhline(1.0, color="#9e9e9e", linewidth=0.8)
    if title:
        fig.suptitle(title)
    FigureCanvasAgg(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
