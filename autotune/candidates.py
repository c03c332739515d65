"""The feasible layouts of a study, ranked by the cost model: what the search draws from.

:func:`rank_candidates` is the one place that combines the space
(:mod:`autotune.space`), the feasibility check (:mod:`autotune.feasibility`), the memory
model and the cost model; the planner shows its output and the study runner searches it.

A candidate's worth is its *expected* throughput, the predicted TFLOPS times the
probability that it fits the device (:attr:`Candidate.expected_tflops`): a layout whose
memory is *uncertain* stays in the space but ranks by what it is expected to give (an
OOM trial gives nothing, costs one short failed step, and rules out its hungrier
siblings). Ranking and the strategies' ``predict`` both use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotune.feasibility import Constraints, Reason
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.models.memory import estimate_memory
from autotune.models.memory_uncertainty import Verdict
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
    p_fit: float = 1.0
    """Probability that the layout fits the device (1 without a memory rule)."""
    memory_verdict: Verdict = Verdict.FITS
    """*fits* or *uncertain* (an *exceeds* layout is no candidate)."""

    @property
    def expected_tflops(self) -> float:
        """``predicted_tflops * p_fit``: what a trial of this layout is expected to give."""
        return self.predicted_tflops * self.p_fit


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
    constraints = constraints or Constraints.from_configs(spec.cluster, spec.training,
                                                          spec.search, spec.trial)
    feasible, _ = partition_space(spec, constraints)
    return rank_layouts(spec, feasible, constraints)


def rank_layouts(spec: StudySpec, layouts: Iterable[Layout],
                 constraints: Constraints | None = None) -> list[Candidate]:
    """``layouts`` with their predictions, best expected throughput first (ties: fewer
    devices per model, then layout order). The probability of fitting comes from
    ``constraints``' memory rule; without one (a replayed table) every layout has 1."""
    out = []
    for layout in layouts:
        step = estimate_step(spec.model, layout, spec.cluster, dtype=spec.training.dtype)
        fit = constraints.memory_verdict(layout, spec.model) if constraints else None
        if fit is None:
            mem = estimate_memory(spec.model, layout, dtype=spec.training.dtype,
                                  device=spec.cluster.device).peak_bytes
            out.append(Candidate(layout, step.model_tflops_per_device, step.step_time_s, mem))
        else:
            out.append(Candidate(layout, step.model_tflops_per_device, step.step_time_s,
                                 fit.predicted_bytes, fit.p_fit, fit.verdict))
    out.sort(key=lambda c: (-c.expected_tflops, c.layout.model_parallel_size, c.layout))
    return out
