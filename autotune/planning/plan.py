"""``autotune plan``: every layout of a study's space, ranked by the cost model, and why the
others are out. No trial runs; it answers in well under a second even for 175B on 1,024
devices (the space is a few thousand layouts; each check and estimate is arithmetic).

:func:`plan_study` builds a :class:`PlanResult` from the ranking of
:mod:`autotune.planning.candidates` (the same order the search draws from: expected throughput,
the predicted one times the probability of fitting) and the excluded layouts grouped by the
first reason code of :mod:`autotune.feasibility`; each feasible row carries its memory
verdict (*fits* or *uncertain*) and probability of fitting, and the header counts the
verdicts of every layout the memory rule judged. With a :class:`~autotune.models.
calibration.Calibration` (what ``autotune plan`` learned from the study's database:
:func:`autotune.runner.learning.plan_calibration`), the memory verdicts use the corrected
budget, ``p_fit`` is conditioned on the study's measured OOMs and runs, each row also carries its
calibrated peak and throughput, and the header says what it learned from. Every row's
predicted throughput carries its 90% band (:mod:`autotune.planning.band`: the interval of
the search's residual posterior before any trial, so the band and the search agree).
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

from autotune.errors import SpecError
from autotune.feasibility import REASON_CODES, Constraints, Reason
from autotune.hardware import GiB
from autotune.layout import Layout
from autotune.models.calibration import Calibration
from autotune.models.cost import StepEstimate, estimate_step
from autotune.models.memory import MemoryEstimate, estimate_memory
from autotune.models.memory_uncertainty import FitVerdict
from autotune.planning import DEFAULT_TOP
from autotune.planning.band import Band, tflops_bands, unvalidated_band_note
from autotune.planning.candidates import (
    Candidate,
    partition_layouts,
    partition_space,
    rank_layouts,
    replayed_rows,
    table_constraints,
)
from autotune.planning.empty import by_first_reason, empty_space_reasons, table_empty_reasons
from autotune.search import Observation
from autotune.spec import StudySpec
from autotune.workloads.deepspeed_version import deepspeed_for_study

__all__ = ["PlanRow", "Exclusion", "PlanResult", "plan_study", "render_plan", "FORMATS"]

FORMATS: tuple[str, ...] = ("table", "csv", "json")


@dataclass(frozen=True)
class PlanRow:
    """One feasible layout with its predictions."""

    rank: int
    layout: Layout
    step: StepEstimate
    memory: MemoryEstimate
    memory_verdict: FitVerdict = FitVerdict.FITS
    """*fits* or *uncertain*: the memory check's verdict (docs/models.md)."""
    p_fit: float = 1.0
    """Probability that the layout fits the device."""
    memory_sigma_bytes: int = 0
    """sd of the predicted peak (the error bar behind ``p_fit``)."""
    calibrated_memory_bytes: int | None = None
    """The predicted peak times the memory correction (``None``: no memory rule)."""
    calibrated_tflops: float | None = None
    """The predicted model TFLOPS per device times the throughput correction."""
    tflops_band: Band | None = None
    """90% band of the model TFLOPS per device (:func:`autotune.planning.band.tflops_bands`)."""


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
    memory_verdicts: tuple[tuple[str, int], ...] = ()
    """``(verdict, count)`` over every layout the memory rule judged (the structurally
    valid ones): fits and uncertain are feasible, exceeds excluded."""
    memory_min_p_fit: float | None = None
    """``trial.memory_min_p_fit`` the verdicts used."""
    calibration: str | None = None
    """What the plan learned from the database, one line (``None``: not calibrated)."""
    calibration_record: dict[str, Any] | None = None
    """The same as :func:`autotune.storage.study_records.learned_from_record` (JSON output)."""
    empty_reasons: tuple[str, ...] = ()
    """Why nothing is feasible (:func:`autotune.planning.empty.empty_space_reasons`); empty
    when some layout is."""
    stack: str = "deepspeed"
    """The training stack the memory and step-time models predicted for (``training.stack``
    resolved: :mod:`autotune.models.stacks`)."""


def plan_study(spec: StudySpec, top: int = DEFAULT_TOP, *, calibration: Calibration | None = None,
               ooms: tuple[Layout, ...] = (), fits: tuple[Layout, ...] = (),
               learn_enabled: bool = True) -> PlanResult:
    """Rank the study's feasible layouts and count the excluded ones by reason; with a
    ``calibration``, under its corrections and conditioned on the measured ``ooms`` and
    on the layouts measured to run, ``fits``. A replayed study's space is its table's rows
    (:func:`replayed_rows`) instead of the search axes', checked as ``run`` checks them
    (:func:`table_constraints`)."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise SpecError("--top", top, "allowed: an integer >= 1")
    constraints = Constraints.from_configs(
        spec.cluster, spec.training, spec.search, spec.trial, profile=spec.profile,
        deepspeed=deepspeed_for_study(spec.search, spec.workload, spec.launcher))
    table = replayed_rows(spec)
    if table is not None:
        constraints = table_constraints(constraints, spec.launcher.replay)
    factor = 1.0
    if calibration is not None:
        constraints = constraints.with_memory_correction(
            calibration.memory_factor, calibration.memory_sd,
            by_stage=calibration.memory_stage_corrections())
        factor = calibration.throughput_factor
    model, cluster, profile = spec.model, spec.cluster, spec.profile
    feasible, excluded = (partition_layouts(table, model, constraints) if table is not None
                          else partition_space(model, cluster, spec.training, spec.search,
                                               constraints))
    ranked = rank_layouts(model, cluster, feasible, dtype=spec.training.dtype,
                          profile=profile, constraints=constraints, ooms=ooms, fits=fits,
                          stack=spec.training.stack)
    # The band is the search's posterior as a run of this study would have it now: the
    # earlier studies' residuals as its warm start (the worker passes the same ones) and
    # the study's own measured trials as its history.
    warm = calibration.residuals if calibration is not None else ()
    predicted = {c.layout: c.predicted_tflops for c in ranked}
    history = [Observation(lay, "ok", value) for lay, value in
               (calibration.runs if calibration is not None else ()) if lay in predicted]
    bands = tflops_bands(predicted, layouts=[c.layout for c in ranked[:top]],
                         history=history, warm_start=warm, device=cluster.device,
                         ceiling=cluster.device_spec().peak_tflops(spec.training.dtype)
                         ) if ranked else {}
    rows = tuple(_row(spec, constraints, i + 1, c, factor, bands.get(c.layout))
                 for i, c in enumerate(ranked[:top]))
    record, line = None, None
    if calibration is not None:
        from autotune.storage import learned_from_line, learned_from_record

        record = learned_from_record(calibration, enabled=learn_enabled)
        line = learned_from_line(record)
    verdicts = Counter(c.memory_verdict.value for c in ranked)
    verdicts["exceeds"] = sum(reasons[0].code == "memory" for _, reasons in excluded)
    exclusions = tuple(Exclusion(code, n, example)
                       for code, n, example in by_first_reason(excluded))
    return PlanResult(
        study=spec.name, model=spec.model.name, world_size=spec.world_size,
        global_batch=spec.training.global_batch, device=spec.cluster.device,
        dtype=spec.training.dtype,
        n_layouts=len(feasible) + len(excluded), n_feasible=len(feasible),
        memory_capacity_bytes=spec.cluster.device_spec().memory_bytes, rows=rows,
        excluded=exclusions,
        profile=profile.label if profile is not None else None,
        memory_verdicts=tuple((v.value, verdicts[v.value]) for v in FitVerdict),
        memory_min_p_fit=constraints.memory.min_p_fit if constraints.memory else None,
        calibration=line, calibration_record=record,
        empty_reasons=() if feasible else _empty_reasons(spec, excluded, table is not None),
        stack=spec.training.stack)


def _empty_reasons(spec: StudySpec, excluded: list[tuple[Layout, list[Reason]]],
                   replayed: bool) -> tuple[str, ...]:
    """Why nothing is feasible: for a replayed table, what excluded its rows (its search
    axes are not its space, so what they would form says nothing)."""
    if replayed:
        return tuple(table_empty_reasons(excluded))
    return tuple(empty_space_reasons(spec.search, spec.world_size, spec.training.global_batch,
                                     excluded))


def _row(spec: StudySpec, constraints: Constraints, rank: int, cand: Candidate,
         throughput_factor: float = 1.0, band: Band | None = None) -> PlanRow:
    dtype, device = spec.training.dtype, spec.cluster.device
    fit = constraints.memory_verdict(cand.layout, spec.model)
    return PlanRow(rank, cand.layout,
                   estimate_step(spec.model, cand.layout, spec.cluster, dtype=dtype,
                                 profile=spec.profile, stack=spec.training.stack),
                   estimate_memory(spec.model, cand.layout, dtype=dtype, device=device,
                                   profile=spec.profile, stack=spec.training.stack,
                                   grad_accum_dtype=spec.training.grad_accum_dtype),
                   cand.memory_verdict, cand.p_fit, fit.sigma_bytes if fit else 0,
                   fit.corrected_bytes if fit else None,
                   cand.predicted_tflops * throughput_factor, band)


_COLUMNS = ("rank", "layout", "tp", "pp", "dp", "micro_batch", "grad_accum", "zero_stage",
            "recompute", "model_tflops_per_device", "step_time_s", "peak_memory_gib",
            "bubble_s", "comm_s", "layer_time", "memory_verdict", "p_fit",
            "peak_memory_sigma_gib", "layer_memory", "calibrated_model_tflops_per_device",
            "calibrated_peak_memory_gib", "sequence_parallel", "model_tflops_band_low",
            "model_tflops_band_high")


def _row_values(row: PlanRow) -> list[Any]:
    lay, st = row.layout, row.step
    comm = st.tp_comm_s + st.pp_p2p_s + st.dp_comm_s + st.zero3_comm_s
    return [row.rank, lay.key(), lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.grad_accum,
            lay.zero_stage, lay.recompute, round(st.model_tflops_per_device, 4),
            round(st.step_time_s, 6), round(row.memory.peak_bytes / GiB, 3),
            round(st.bubble_s, 6), round(comm, 6), "measured" if st.profiled else "model",
            row.memory_verdict.value, round(row.p_fit, 4),
            round(row.memory_sigma_bytes / GiB, 3),
            "measured" if row.memory.profiled else "model",
            None if row.calibrated_tflops is None else round(row.calibrated_tflops, 4),
            None if row.calibrated_memory_bytes is None
            else round(row.calibrated_memory_bytes / GiB, 3), lay.sequence_parallel,
            *([round(x, 4) for x in row.tflops_band] if row.tflops_band else [None, None])]


def _fit_cell(row: PlanRow) -> str:
    """``fits`` or ``uncertain 31%`` (the probability only where it is not ~1)."""
    if row.memory_verdict is FitVerdict.FITS:
        return "fits"
    return f"{row.memory_verdict.value} {100 * row.p_fit:.0f}%"


def _band_cell(row: PlanRow) -> str:
    """``61-152``: the 90% band, to the precision of the prediction beside it."""
    if row.tflops_band is None:
        return "-"
    lo, hi = row.tflops_band
    digits = 0 if hi >= 10 else 4
    return f"{lo:.{digits}f}-{hi:.{digits}f}"


def _cell(row: PlanRow, pick: int) -> Any:
    if pick == -1:
        return _fit_cell(row)
    if pick == -2:
        return _band_cell(row)
    return _row_values(row)[pick]


def _verdict_line(result: PlanResult) -> str:
    counts = dict(result.memory_verdicts)
    judged = sum(counts.values())
    return (f"memory ({judged} layouts judged, excluded below P(fit) "
            f"{100 * (result.memory_min_p_fit or 0):.1f}%): {counts.get('fits', 0)} fits, "
            f"{counts.get('uncertain', 0)} uncertain, {counts.get('exceeds', 0)} exceeds")


def _to_json(result: PlanResult) -> dict[str, Any]:
    return {
        "study": result.study, "model": result.model, "world_size": result.world_size,
        "global_batch": result.global_batch, "device": result.device, "dtype": result.dtype,
        "stack": result.stack,
        "n_layouts": result.n_layouts, "n_feasible": result.n_feasible,
        "n_excluded": result.n_layouts - result.n_feasible,
        "memory_capacity_bytes": result.memory_capacity_bytes,
        "profile": result.profile,
        "memory_verdicts": dict(result.memory_verdicts),
        "memory_min_p_fit": result.memory_min_p_fit,
        "calibration": result.calibration_record,
        "empty_reasons": list(result.empty_reasons),
        "feasible": [{"rank": r.rank, "layout": r.layout.to_dict(), "key": r.layout.key(),
                      "model_tflops_per_device": r.step.model_tflops_per_device,
                      "model_tflops_band": list(r.tflops_band) if r.tflops_band else None,
                      "step_time_s": r.step.step_time_s,
                      "peak_memory_bytes": r.memory.peak_bytes,
                      "memory_verdict": r.memory_verdict.value, "p_fit": r.p_fit,
                      "peak_memory_sigma_bytes": r.memory_sigma_bytes,
                      "calibrated_model_tflops_per_device": r.calibrated_tflops,
                      "calibrated_peak_memory_bytes": r.calibrated_memory_bytes,
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
    from autotune.util.text import format_table

    head = (f"study {result.study}: {result.model} on {result.world_size} x {result.device} "
            f"({result.dtype}, stack {result.stack}), global batch {result.global_batch}, "
            f"{result.memory_capacity_bytes / GiB:.0f} GiB per device\n"
            f"{result.n_layouts} layouts: {result.n_feasible} feasible, "
            f"{result.n_layouts - result.n_feasible} excluded; top {len(result.rows)} "
            "by predicted model TFLOPS per device x P(fit)")
    if result.memory_min_p_fit is not None:
        head += "\n" + _verdict_line(result)
    slowest = result.rows[0].step.straggler_factor if result.rows else 1.0
    if slowest > 1.0:
        # Why every prediction sits a few percent under the median device's (stragglers).
        head += (f"\nslowest device: kernels {100 * (slowest - 1):.1f}% longer than on the "
                 f"median device (the slowest of {result.world_size}; docs/models.md, "
                 "\"The slowest device\")")
    note = unvalidated_band_note(result.device) if result.rows else None
    measured = ((result.calibration_record or {}).get("throughput") or {}).get("ok")
    if note is not None and not measured:
        # Why the band spans a factor of ~100 here and ~3 on an A100 (prediction_spread),
        # wherever no measured throughput narrows it (a database with none leaves the
        # prior's band: the note stands beside its learned-from line).
        head += "\n" + note
    cols = ["rank", "layout", "TFLOPS/dev", "90% band", "step_s", "mem_GiB", "+-GiB",
            "memory", "bubble_s", "comm_s"]
    picks = [0, 1, 9, -2, 10, 11, 17, -1, 12, 13]
    if result.calibration is not None:
        head += ("\ncalibration: " + result.calibration
                 + " (cal_* columns: the predictions corrected; the ranking is unchanged"
                 " by the throughput factor, the memory verdicts use the correction)")
        cols[5:5] = ["cal_TFLOPS"]
        picks[5:5] = [19]
        cols[7:7] = ["cal_mem"]
        picks[7:7] = [20]
    if result.profile is not None:
        n = sum(r.step.profiled for r in result.rows)
        n_mem = sum(r.memory.profiled for r in result.rows)
        head += (f"\nlayer times: measured for {n} of these {len(result.rows)} layouts "
                 f"(profile {result.profile}), the cost model's for the rest"
                 f"\nlayer activation memory: measured for {n_mem} of them, the memory "
                 "model's for the rest")
        cols += ["layer", "layer_mem"]
        picks += [14, 18]
    body = format_table(cols, [[_cell(r, i) for i in picks] for r in result.rows])
    out = [head, "", body if result.rows else "no feasible layout:\n" + "\n".join(
        f"  - {reason}" for reason in result.empty_reasons)]
    if result.excluded:
        out += ["", "excluded (by first reason):",
                format_table(["reason", "count", "example"],
                             [[e.code, e.count, e.example] for e in result.excluded])]
    return "\n".join(out)
