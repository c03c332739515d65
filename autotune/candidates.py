"""The feasible layouts of a study, ranked by the cost model: what the search draws from.

:func:`rank_candidates` is the one place that combines the space
(:mod:`autotune.space`), the feasibility check (:mod:`autotune.feasibility`), the memory
model and the cost model; the planner shows its output and the study runner searches it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotune.feasibility import Constraints, Reason
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.models.memory import estimate_memory
from autotune.space import enumerate_layouts
from autotune.spec import StudySpec

__all__ = ["Candidate", "rank_candidates", "rank_layouts", "partition_space"]


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    predicted_tflops: float
    """Cost-model model TFLOPS per device."""
    predicted_step_time_s: float
    predicted_memory_bytes: int


def partition_space(spec: StudySpec, constraints: Constraints | None = None,
                    ) -> tuple[list[Layout], list[tuple[Layout, list[Reason]]]]:
    """Every layout of the space, split into feasible ones and excluded ones with reasons."""
    constraints = constraints or Constraints.from_configs(spec.cluster, spec.training,
                                                          spec.search, spec.trial)
    feasible, excluded = [], []
    for layout in enumerate_layouts(spec.search, spec.world_size, spec.training.global_batch):
        reasons = constraints.check(layout, spec.model)
        if reasons:
            excluded.append((layout, reasons))
        else:
            feasible.append(layout)
    return feasible, excluded


def rank_candidates(spec: StudySpec, constraints: Constraints | None = None) -> list[Candidate]:
    """Feasible layouts, best predicted throughput first (ties: fewer devices per model)."""
    feasible, _ = partition_space(spec, constraints)
    return rank_layouts(spec, feasible)


def rank_layouts(spec: StudySpec, layouts: Iterable[Layout]) -> list[Candidate]:
    """``layouts`` with their predictions, best predicted throughput first (ties: fewer
    devices per model, then layout order)."""
    out = []
    for layout in layouts:
        step = estimate_step(spec.model, layout, spec.cluster, dtype=spec.training.dtype)
        mem = estimate_memory(spec.model, layout, dtype=spec.training.dtype,
                              device=spec.cluster.device)
        out.append(Candidate(layout, step.model_tflops_per_device, step.step_time_s,
                             mem.peak_bytes))
    out.sort(key=lambda c: (-c.predicted_tflops, c.layout.model_parallel_size, c.layout))
    return out
