"""The ZeRO-3 variant rows of the measured tables (MiCS, hpZ on Aurora) against the cost
model: each row's prediction error, and one comparison across the whole table.

The Aurora table's groups hold one or two layouts each, below ``--min-layouts``, so the
per-group Spearman says nothing about them. Instead every ``ok`` row of every loaded group
is predicted on its own group's cluster and model and ranked by predicted model TFLOPS per
device among all those rows: the ranks the plan gives the MiCS rows (1 = predicted
fastest) beside their measured ranks. The JSON key is ``zero3_variants``
(docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
from typing import Any

from autotune.landscape import LandscapeGroup
from autotune.models.cost import estimate_step
from benchmarks._common import spearman

__all__ = ["zero3_variant_report", "print_zero3_variants"]


def _ranks(values: list[float]) -> list[int]:
    """1 for the largest value, 2 for the next..."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0] * len(values)
    for rank, i in enumerate(order, start=1):
        out[i] = rank
    return out


def zero3_variant_report(groups: list[LandscapeGroup]) -> dict[str, Any]:
    """Per variant row: measured, predicted, relative error; the MiCS rows' predicted and
    measured ranks among all ``ok`` rows; Spearman over all of them."""
    rows: list[dict[str, Any]] = []
    for g in groups:
        for m in g.ok():
            est = estimate_step(g.model, m.layout, g.cluster, dtype=g.dtype,
                                stack=g.stack)
            rows.append({"group": g.name, "layout": m.layout.key(),
                         "zero_variant": m.layout.zero_variant,
                         "measured_tflops": float(m.model_tflops_per_device or 0.0),
                         "predicted_tflops": est.model_tflops_per_device})
    if not rows:
        return {"n_rows": 0, "rows": [], "mics_ranks": []}
    predicted_rank = _ranks([r["predicted_tflops"] for r in rows])
    measured_rank = _ranks([r["measured_tflops"] for r in rows])
    for r, p, q in zip(rows, predicted_rank, measured_rank, strict=True):
        r["predicted_rank"], r["measured_rank"] = p, q
        r["error"] = r["predicted_tflops"] / r["measured_tflops"] - 1.0
    variant = [r for r in rows if r["zero_variant"] != "none"]
    errors = {v: [abs(r["error"]) for r in variant if r["zero_variant"] == v]
              for v in sorted({r["zero_variant"] for r in variant})}
    return {
        "n_rows": len(rows),
        "spearman_all_rows": spearman([r["predicted_tflops"] for r in rows],
                                      [r["measured_tflops"] for r in rows]),
        "median_abs_error": {v: statistics.median(e) for v, e in errors.items() if e},
        "mics_ranks": [{"group": r["group"], "predicted_rank": r["predicted_rank"],
                        "measured_rank": r["measured_rank"]}
                       for r in variant if r["zero_variant"] == "mics"],
        "rows": variant,
    }


def print_zero3_variants(report: dict[str, Any]) -> None:
    """The report as text (nothing when no table has variant rows)."""
    if not report["rows"]:
        return
    print(f"\nZeRO-3 variant rows ({len(report['rows'])} of {report['n_rows']} ok rows; "
          f"Spearman over all rows {report['spearman_all_rows']:.2f}):")
    for r in report["rows"]:
        print(f"  {r['group']:<44} measured {r['measured_tflops']:6.1f}  predicted "
              f"{r['predicted_tflops']:6.1f}  error {r['error']:+.0%}  rank predicted "
              f"{r['predicted_rank']}/{report['n_rows']}, measured {r['measured_rank']}")
    for v, e in report["median_abs_error"].items():
        print(f"  median |error| {v}: {e:.0%}")
