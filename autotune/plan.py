"""``autotune plan``: every layout of a study's space, ranked by the cost model, and why the
others are out. No trial runs; it answers in well under a second even for 175B on 1,024
devices (the space is a few thousand layouts; each check and estimate is arithmetic).

:func:`plan_study` builds a :class:`PlanResult` from the ranking of
:mod:`autotune.candidates` (the same order the search draws from) and the excluded
layouts grouped by the first reason code of :mod:`autotune.feasibility`;
:func:`render_plan` prints it as an aligned table, CSV or JSON.

>>> from autotune.spec import load_study
>>> result = plan_study(load_study("studies/cpu_demo.yaml"), top=3)
>>> len(result.rows) <= 3 and result.n_feasible > 0
True
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from autotune.candidates import partition_space, rank_layouts
from autotune.errors import SpecError
from autotune.feasibility import REASON_CODES, Constraints
from autotune.layout import Layout
from autotune.models.cost import StepEstimate, estimate_step
from autotune.models.memory import MemoryEstimate, estimate_memory
from autotune.spec import StudySpec

__all__ = ["PlanRow", "Exclusion", "PlanResult", "plan_study", "render_plan", "FORMATS"]

FORMATS: tuple[str, ...] = ("table", "csv", "json")
GiB = 1024**3


@dataclass(frozen=True)
class PlanRow:
    """One feasible layout with its predictions."""

    rank: int
    layout: Layout
    step: StepEstimate
    memory: MemoryEstimate


@dataclass(frozen=True)
class Exclusion:
    """Excluded layouts sharing a first reason code."""

    code: str
    count: int
    example: str
    """The message of the first such layout (with its numbers)."""


@dataclass(frozen=True)
class PlanResult:
    study: str
    model: str
    world_size: int
    global_batch: int
    device: str
    dtype: str
    n_layouts: int
    n_feasible: int
    memory_capacity_bytes: int
    rows: tuple[PlanRow, ...]
    """The best ``top`` feasible layouts, best predicted throughput first."""
    excluded: tuple[Exclusion, ...] = field(default_factory=tuple)
    """Excluded layouts by first reason code, most frequent first."""
    profile: str | None = None
    """Source of the measured layer times (``cluster.profile``), if the study has some."""


def plan_study(spec: StudySpec, top: int = 20) -> PlanResult:
    """Rank the study's feasible layouts and count the excluded ones by reason."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise SpecError("--top", top, "allowed: an integer >= 1")
    constraints = Constraints.from_configs(spec.cluster, spec.training, spec.search,
                                           spec.trial)
    feasible, excluded = partition_space(spec, constraints)
    ranked = rank_layouts(spec, feasible)  # rank_candidates would check the space again
    dtype, device = spec.training.dtype, spec.cluster.device
    rows = tuple(
        PlanRow(i + 1, c.layout,
                estimate_step(spec.model, c.layout, spec.cluster, dtype=dtype),
                estimate_memory(spec.model, c.layout, dtype=dtype, device=device))
        for i, c in enumerate(ranked[:top]))
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for layout, reasons in excluded:
        code = reasons[0].code
        counts[code] += 1
        examples.setdefault(code, f"{layout.key()}: {reasons[0].message}")
    exclusions = tuple(Exclusion(code, n, examples[code]) for code, n in counts.most_common())
    return PlanResult(
        study=spec.name, model=spec.model.name, world_size=spec.world_size,
        global_batch=spec.training.global_batch, device=device, dtype=dtype,
        n_layouts=len(feasible) + len(excluded), n_feasible=len(feasible),
        memory_capacity_bytes=spec.cluster.device_spec().memory_bytes, rows=rows,
        excluded=exclusions,
        profile=spec.cluster.profile.label if spec.cluster.profile is not None else None)


_COLUMNS = ("rank", "layout", "tp", "pp", "dp", "micro_batch", "grad_accum", "zero_stage",
            "recompute", "model_tflops_per_device", "step_time_s", "peak_memory_gib",
            "bubble_s", "comm_s", "layer_time")


def _row_values(row: PlanRow) -> list[Any]:
    lay, st = row.layout, row.step
    comm = st.tp_comm_s + st.pp_p2p_s + st.dp_comm_s + st.zero3_comm_s
    return [row.rank, lay.key(), lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.grad_accum,
            lay.zero_stage, lay.recompute, round(st.model_tflops_per_device, 4),
            round(st.step_time_s, 6), round(row.memory.peak_bytes / GiB, 3),
            round(st.bubble_s, 6), round(comm, 6), "measured" if st.profiled else "model"]


def _to_json(result: PlanResult) -> dict[str, Any]:
    return {
        "study": result.study, "model": result.model, "world_size": result.world_size,
        "global_batch": result.global_batch, "device": result.device, "dtype": result.dtype,
        "n_layouts": result.n_layouts, "n_feasible": result.n_feasible,
        "n_excluded": result.n_layouts - result.n_feasible,
        "memory_capacity_bytes": result.memory_capacity_bytes,
        "profile": result.profile,
        "feasible": [{"rank": r.rank, "layout": r.layout.to_dict(), "key": r.layout.key(),
                      "model_tflops_per_device": r.step.model_tflops_per_device,
                      "step_time_s": r.step.step_time_s,
                      "peak_memory_bytes": r.memory.peak_bytes,
                      "step": r.step.to_dict(),
                      "memory": {k: v for k, v in r.memory.__dict__.items()}}
                     for r in result.rows],
        "excluded": [{"code": e.code, "count": e.count, "description": REASON_CODES.get(e.code),
                      "example": e.example} for e in result.excluded],
    }


def render_plan(result: PlanResult, fmt: str = "table") -> str:
    """The plan as ``table`` (aligned text), ``csv`` (feasible rows) or ``json``."""
    if fmt == "json":
        return json.dumps(_to_json(result), indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(_COLUMNS)
        writer.writerows(_row_values(r) for r in result.rows)
        return buf.getvalue().rstrip("\n")
    if fmt != "table":
        raise SpecError("--format", fmt, f"allowed: one of {', '.join(FORMATS)}")
    from autotune.tables import format_table

    head = (f"study {result.study}: {result.model} on {result.world_size} x {result.device} "
            f"({result.dtype}), global batch {result.global_batch}, "
            f"{result.memory_capacity_bytes / GiB:.0f} GiB per device\n"
            f"{result.n_layouts} layouts: {result.n_feasible} feasible, "
            f"{result.n_layouts - result.n_feasible} excluded; top {len(result.rows)} "
            "by predicted model TFLOPS per device")
    cols = ["rank", "layout", "TFLOPS/dev", "step_s", "mem_GiB", "bubble_s", "comm_s"]
    picks = [0, 1, 9, 10, 11, 12, 13]
    if result.profile is not None:
        n = sum(r.step.profiled for r in result.rows)
        head += (f"\nlayer times: measured for {n} of these {len(result.rows)} layouts "
                 f"(profile {result.profile}), the cost model's for the rest")
        cols.append("layer")
        picks.append(14)
    body = format_table(cols, [[_row_values(r)[i] for i in picks] for r in result.rows])
    out = [head, "", body if result.rows else "(no feasible layout)"]
    if result.excluded:
        out += ["", "excluded (by first reason):",
                format_table(["reason", "count", "example"],
                             [[e.code, e.count, e.example] for e in result.excluded])]
    return "\n".join(out)
