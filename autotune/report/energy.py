"""The report's time-energy section: the Pareto front of the measured layouts.

A layout is on the front when no other measured layout is both faster (shorter
step) and more frugal (fewer joules per token): the layouts worth choosing between when
energy counts (Chung et al., "Perseus", SOSP 2024, draw the same front per iteration).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from autotune.energy import NOT_MEASURED
from autotune.report.render import Section, Table, Text

__all__ = ["pareto_front", "energy_section"]


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated ``(step time, joules per token)`` points (both lower
    is better), fastest first.

    >>> pareto_front([(1.0, 5.0), (2.0, 3.0), (2.5, 4.0), (3.0, 1.0), (1.0, 6.0)])
    [0, 1, 3]
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_energy = [], float("inf")
    for i in order:
        if points[i][1] < best_energy:
            front.append(i)
            best_energy = points[i][1]
    return front


def energy_section(meas: pd.DataFrame) -> Section:
    """Energy per step and per token of the measured layouts; their Pareto front."""
    s = Section("Time and energy")
    if meas.empty or "joules_per_token" not in meas:
        s.blocks.append(Text(NOT_MEASURED))
        return s
    done = meas[(meas["outcome"] == "complete") & meas["joules_per_token"].notna()
                & meas["step_time_s"].notna()]
    if done.empty:
        s.blocks.append(Text(f"{NOT_MEASURED}: no measured layout has an energy figure "
                             "(docs/trainer.md, \"Energy\")."))
        return s
    done = done.reset_index(drop=True)
    front = pareto_front(list(zip(done["step_time_s"], done["joules_per_token"],
                                  strict=True)))
    cols = ["layout_key", "step_time_s", "model_tflops_per_device", "energy_j_per_step",
            "joules_per_token", "model_tflops_per_watt", "energy_source"]
    s.blocks.append(Text(f"{len(front)} of {len(done)} measured layouts are on the "
                         "time-energy Pareto front (no other layout is both faster and "
                         "uses fewer joules per token):"))
    s.blocks.append(Table(done.loc[front, cols], caption="Pareto front, fastest first"))
    return s
