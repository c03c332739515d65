"""Static PNG plots of a report, drawn with matplotlib's object API on the Agg canvas.

No ``pyplot``: each function builds its own :class:`~matplotlib.figure.Figure`, so no
global figure state survives a call and nothing needs a display. Each takes a frame from
:mod:`autotune.report.analysis`, writes ``path`` atomically and returns nothing; callers
decide beforehand whether there is anything to draw.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from autotune.report.analysis import OUTCOME_LABELS
from autotune.report.files import atomic_path
from autotune.trial.outcome import Outcome

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["OUTCOME_COLORS", "tp_pp_heatmap", "microbatch_effect", "memory_vs_capacity",
           "outcomes_map", "tuning_cost", "importance", "scaling"]

OUTCOME_COLORS = {**{o.value: o.colour for o in Outcome},
                  "fail": "#795548", "running": "#90caf9", "skipped": "#e0e0e0"}
"""Colours of the outcomes (:attr:`autotune.trial.outcome.Outcome.colour`) and of trials
without one."""
_SHORT = {**{o.value: o.short for o in Outcome}, "fail": "failed"}
_DPI = 100


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


def _save(fig: Figure, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def _span_label(lo: float, hi: float) -> str:
    """What a colour scale spans, said where it is read (a spread of a few per cent fills
    the whole scale)."""
    if not hi > lo:
        return f"one colour: every cell {_fmt(hi)}"
    return f"colours span {_fmt(lo)} to {_fmt(hi)} ({100 * (hi - lo) / hi:.0f}% of the best)"


def tp_pp_heatmap(best: pd.DataFrame, what: pd.DataFrame, path: Path) -> None:
    """Best measured model TFLOPS per device for each (tp, pp), a cell whose best is a
    trial stopped early marked so; empty cells name their outcome."""
    fig = _figure(max(1.6 + 1.1 * len(best.columns), 4.8), 1.5 + 0.8 * len(best.index))
    ax = fig.add_subplot()
    data = best.to_numpy(dtype=float)
    masked = np.ma.masked_invalid(data)
    im = ax.imshow(masked, cmap="viridis", aspect="auto", origin="lower")
    finite = data[np.isfinite(data)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            kind = what.iat[i, j]
            if np.isfinite(data[i, j]):
                mark = "\n(stopped)" if kind == Outcome.STOPPED.value else ""
                ax.text(j, i, _fmt(data[i, j]) + mark, ha="center", va="center",
                        color="black" if data[i, j] - lo > 0.5 * (hi - lo) else "white",
                        fontsize=9)
            else:
                label = "not tried" if not isinstance(kind, str) else _SHORT.get(kind, kind)
                ax.text(j, i, label, ha="center", va="center", fontsize=8,
                        color=OUTCOME_COLORS.get(kind, "black") if isinstance(kind, str)
                        else "#757575")
    ax.set_xticks(range(len(best.columns)), [str(c) for c in best.columns])
    ax.set_yticks(range(len(best.index)), [str(r) for r in best.index])
    ax.set_xlabel("tensor parallel (tp)")
    ax.set_ylabel("pipeline parallel (pp)")
    ax.set_title(f"best model TFLOPS per device\n{_span_label(lo, hi)}", fontsize=8)
    fig.colorbar(im, ax=ax, label="TFLOPS / device")
    _save(fig, path)


def _points(ax: Axes, x: pd.Series, y: pd.Series, stopped: pd.Series, color: str,
            label: str | None = None) -> None:
    """Complete trials filled, trials stopped early hollow, at their measured value."""
    full = ~stopped.to_numpy(dtype=bool)
    ax.scatter(x[full], y[full], color=color, label=label, zorder=3)
    if (~full).any():
        ax.scatter(x[~full], y[~full], facecolors="none", edgecolors=color, zorder=3,
                   label=None if label is None else f"{label} (stopped early)")


def _zoom(ax: Axes, values: pd.Series, axis: str = "y") -> None:
    """An axis range around the data (a few % either side), not from zero."""
    lo, hi = float(values.min()), float(values.max())
    pad = 0.08 * (hi - lo) if hi > lo else 0.05 * abs(hi) or 1.0
    (ax.set_ylim if axis == "y" else ax.set_xlim)(lo - pad, hi + pad)


def microbatch_effect(done: pd.DataFrame, path: Path) -> None:
    """Left: TFLOPS vs micro-batch per (tp, pp), every measured trial a point (stopped
    early: hollow), the line through each micro-batch's best, labelled with grad_accum.
    Right: TFLOPS vs the 1F1B bubble fraction ``(pp - 1) / grad_accum``, every trial."""
    fig = _figure(11, 4.2)
    left, right = fig.subplots(1, 2)
    for (tp, pp), group in done.groupby(["tp", "pp"]):
        stopped = group["outcome"] == Outcome.STOPPED.value
        g = group.groupby("micro_batch", as_index=False).agg(
            value=("value", "max"), grad_accum=("grad_accum", "first"))
        line, = left.plot(g["micro_batch"], g["value"], label=f"tp{tp} pp{pp}")
        _points(left, group["micro_batch"], group["value"], stopped, line.get_color())
        for _, row in g.iterrows():
            left.annotate(f"ga{int(row['grad_accum'])}", (row["micro_batch"], row["value"]),
                          textcoords="offset points", xytext=(4, 4), fontsize=7,
                          color=line.get_color())
        _points(right, group["bubble_fraction"], group["value"], stopped, line.get_color(),
                label=f"tp{tp} pp{pp}")
    left.set_xscale("log", base=2)
    mbs = sorted(done["micro_batch"].unique())
    left.set_xticks(mbs, [str(m) for m in mbs])
    _zoom(left, done["value"])
    _zoom(right, done["value"])
    left.set_xlabel("micro-batch size (sequences)")
    left.set_ylabel("model TFLOPS / device")
    left.set_title("micro-batch size (labels: gradient-accumulation steps)")
    left.legend(fontsize=8)
    right.set_xlabel("pipeline bubble fraction (pp - 1) / grad_accum")
    right.set_ylabel("model TFLOPS / device")
    right.set_title("pipeline bubble (hollow: stopped early)")
    right.legend(fontsize=7)
    _save(fig, path)


_FAR = 1.5
"""The capacity line is drawn where it lies within this factor of the data's largest
memory; farther out it would squeeze every trial into one dot, so it is marked at the
edge instead."""


def memory_vs_capacity(trials: pd.DataFrame, capacity_gib: float | None, path: Path) -> None:
    """Measured peak vs predicted memory per trial (stopped early: hollow); OOM trials drawn
    at the top edge. The axes are zoomed to the data; the device capacity is a line when
    it lies near the data, else an arrow at the edge naming it."""
    fig = _figure(6.5, 5.2)
    ax = fig.add_subplot()
    ok = trials[trials["peak_memory_gib"].notna() & trials["predicted_memory_gib"].notna()]
    _points(ax, ok["predicted_memory_gib"], ok["peak_memory_gib"],
            ok["outcome"] == Outcome.STOPPED.value, OUTCOME_COLORS["complete"],
            label="measured peak")
    oom = trials[(trials["outcome"] == "oom") & trials["predicted_memory_gib"].notna()]
    values = pd.concat([ok["predicted_memory_gib"], ok["peak_memory_gib"],
                        oom["predicted_memory_gib"]])
    data_hi = float(values.max()) if len(values) else 1.0
    data_lo = float(values.min()) if len(values) else 0.0
    near = capacity_gib is not None and capacity_gib <= _FAR * data_hi
    if capacity_gib is not None and (near or len(oom)):
        data_hi = max(data_hi, capacity_gib)  # an OOM is only meaningful against it
        near = True
    pad = 0.08 * (data_hi - data_lo) if data_hi > data_lo else 0.1 * data_hi or 1.0
    lo, hi = max(data_lo - pad, 0.0), data_hi + pad
    if len(oom):
        ax.scatter(oom["predicted_memory_gib"], [capacity_gib or data_hi] * len(oom),
                   marker="x", s=60, color=OUTCOME_COLORS["oom"],
                   label="out of memory (drawn at capacity)")
    ax.plot([lo, hi], [lo, hi], color="#757575", linestyle=":", label="measured = predicted")
    if capacity_gib is not None and near:
        ax.axhline(capacity_gib, color=OUTCOME_COLORS["oom"], linestyle="--", linewidth=1)
        ax.axvline(capacity_gib, color=OUTCOME_COLORS["oom"], linestyle="--", linewidth=1,
                   label=f"device memory {capacity_gib:.3g} GiB")
    elif capacity_gib is not None:
        ax.annotate(f"device memory {capacity_gib:.3g} GiB\n(off scale, "
                    f"{capacity_gib / data_hi:.0f}x the largest)", xy=(0.98, 0.99),
                    xycoords="axes fraction", ha="right", va="top", fontsize=8,
                    color=OUTCOME_COLORS["oom"], arrowprops=None)
        ax.annotate("", xy=(0.99, 1.0), xytext=(0.99, 0.9), xycoords="axes fraction",
                    arrowprops={"arrowstyle": "->", "color": OUTCOME_COLORS["oom"]})
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted memory per device (GiB)")
    ax.set_ylabel("measured peak memory per device (GiB)")
    ax.set_title("predicted vs measured memory")
    ax.legend(fontsize=8, loc="upper left")
    _save(fig, path)


def outcomes_map(trials: pd.DataFrame, path: Path) -> None:
    """One cell per (tp, pp, ZeRO, recompute) row and micro-batch column, coloured by the
    outcome of its latest trial."""
    t = trials.sort_values("number")
    t = t.assign(row=[f"tp{a} pp{b} z{c} {d}" for a, b, c, d in
                      zip(t["tp"], t["pp"], t["zero_stage"], t["recompute"],
                                             strict=True)])
    latest = t.groupby(["row", "micro_batch"])["outcome"].last()
    rows = sorted(latest.index.get_level_values(0).unique(),
                  key=lambda r: [int(x[2:]) if x[:2] in ("tp", "pp") else x
                                 for x in r.replace(" z", " zz").split()])
    cols = sorted(latest.index.get_level_values(1).unique())
    fig = _figure(2.4 + 0.9 * len(cols), 1.4 + 0.32 * len(rows))
    ax = fig.add_subplot()
    seen: set[str] = set()
    for (row, mb), kind in latest.items():
        y, x = rows.index(row), cols.index(mb)
        ax.add_patch(_rect(x, y, OUTCOME_COLORS.get(kind, "black")))
        ax.text(x, y, _SHORT.get(kind, kind), ha="center",
                va="center", fontsize=7, color="white" if kind != "infeasible" else "black")
        seen.add(kind)
    ax.set_xlim(-0.5, len(cols) - 0.5)
    ax.set_ylim(-0.5, len(rows) - 0.5)
    ax.set_xticks(range(len(cols)), [str(c) for c in cols])
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("micro-batch size")
    ax.set_title("outcome of each layout tried")
    from matplotlib.patches import Patch

    handles = [Patch(color=OUTCOME_COLORS[k], label=OUTCOME_LABELS.get(k, k))
               for k in OUTCOME_COLORS if k in seen]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


def _rect(x: float, y: float, color: str):  # -> Rectangle
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.45, y - 0.42), 0.9, 0.84, color=color)


def tuning_cost(cost: pd.DataFrame, path: Path) -> None:
    """Device-hours per outcome (the ``total`` row left out)."""
    rows = cost[cost["outcome"] != "total"]
    labels = {v: k for k, v in OUTCOME_LABELS.items()}
    fig = _figure(6.5, 1.2 + 0.45 * len(rows))
    ax = fig.add_subplot()
    colors = [OUTCOME_COLORS.get(labels.get(o, o), "#616161") for o in rows["outcome"]]
    ax.barh(rows["outcome"], rows["device_hours"], color=colors)
    for y, v in enumerate(rows["device_hours"]):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("device-hours (elapsed x world size)")
    ax.set_title("tuning cost by outcome")
    _save(fig, path)


def importance(values: dict[str, float], path: Path) -> None:
    items = sorted(values.items(), key=lambda kv: kv[1])
    fig = _figure(6.0, 1.0 + 0.45 * len(items))
    ax = fig.add_subplot()
    ax.barh([k for k, _ in items], [v for _, v in items], color="#1565c0")
    ax.set_xlabel("importance (PED-ANOVA, sums to 1)")
    ax.set_title("parameter importance for model TFLOPS / device")
    _save(fig, path)


def scaling(best: pd.DataFrame, path: Path) -> None:
    """Best TFLOPS per device vs node count, one line per (model, device type)."""
    fig = _figure(7.5, 4.8)
    ax = fig.add_subplot()
    for (model, device), g in best.groupby(["model_name", "device_type"]):
        g = g.groupby("nodes", as_index=False)["best_tflops_per_device"].max()
        ax.plot(g["nodes"], g["best_tflops_per_device"], marker="o",
                label=f"{model} on {device}")
    ax.set_xscale("log", base=2)
    nodes = sorted(best["nodes"].unique())
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("nodes")
    ax.set_ylabel("best model TFLOPS / device")
    ax.set_title("best layout per node count (flat = perfect weak scaling)")
    ax.legend(fontsize=8)
    if not math.isfinite(float(best["best_tflops_per_device"].max())):
        ax.set_ylim(0, 1)
    _save(fig, path)
