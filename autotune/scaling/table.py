"""The scaling table: per size, the best layout measured and the one the model predicts.

Measured (:func:`measured_rows`): each size's study's best trial (its layout, model TFLOPS
per device, tokens per second, energy where measured). Predicted (:func:`predicted_rows`):
the cost model's best layout at the size (``autotune plan``'s ranking), its throughput
times the throughput correction calibrated on the **measured sizes smaller than it** (the
calibration key has no world size: device type, dtype, workload; ``docs/models.md``), with
a 95% interval ``exp(+-1.96 sd)`` of that correction's log-sd. So a measured size also
shows what its smaller sizes predicted for it, and the error of the extrapolation reads
off the table; sizes beyond the measured ones are the curve extended. Without a
measurement below a size its prediction is the cost model's alone (``uncalibrated``), with
the plan's 90% band (:mod:`autotune.planning.band`), and its efficiency against the base's
prediction carries the band of that ratio under the same prior
(:func:`~autotune.planning.band.ratio_band`: the overall scale cancels, the axes the two
layouts differ in do not).

Efficiency (:func:`autotune.scaling.sizes.scaling_efficiency`) is against the smallest
size's measured per-device throughput where it was measured, else its prediction; where
the smallest sizes have neither (no layout fits them: a large model on few nodes), against
the smallest size that has one (:func:`efficiency_base`), and the table says so and why
those sizes have none (:attr:`ScalingRow.note`).

Which layouts a size may use is judged as its run will judge it (:func:`judged_calibration`):
under the memory correction a run of that size starts from (every earlier study of the
device in the database, and the size's own rows), so a size its run refuses shows no
layout, in the run's words, and one the model alone rules out but measured peaks admit
shows its best layout. Only the throughput stays calibrated on the smaller sizes.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.energy import energy_text
from autotune.layout import Layout
from autotune.models.flops import model_flops_per_step
from autotune.planning.band import ratio_band
from autotune.scaling.held import (
    HELD_CSV_COLUMNS,
    HeldPrediction,
    held_efficiency,
    held_json,
    held_lines,
    held_values,
    predict_held,
)
from autotune.scaling.sizes import ScalingRequest, scaling_efficiency, size_spec
from autotune.spec import StudySpec
from autotune.util.text import format_table

if TYPE_CHECKING:  # the database layer loads where a database is read (plan_command)
    from autotune.models.calibration import Calibration
    from autotune.storage import Storage

__all__ = ["ScalingRow", "measured_rows", "predicted_rows", "scaling_table", "with_efficiency",
           "efficiency_base", "judged_calibration", "scaling_json", "format_scaling",
           "scaling_csv", "CSV_COLUMNS", "Z_95"]

Z_95 = 1.959964
CSV_COLUMNS = ("nodes", "devices", "best_layout", "model_tflops_per_device", "tokens_per_s",
               "efficiency", "mode", "source", "global_batch", "study", "trials",
               "model_tflops_per_device_low", "model_tflops_per_device_high",
               "efficiency_low", "efficiency_high", "calibrated_on", "energy_j_per_step",
               "energy_source", "joules_per_token", "model_tflops_per_watt",
               *HELD_CSV_COLUMNS)
"""The first eight are the contract's (CONTRACTS.md, "A scaling study writes its table");
the last six, a predicted row's held curve (:mod:`.held`)."""


@dataclass(frozen=True)
class ScalingRow:
    """One size, measured or predicted."""

    size: int
    nodes: int
    devices: int
    global_batch: int
    mode: str
    source: str
    """``measured`` or ``predicted``."""
    study: str
    best_layout: str | None = None
    model_tflops_per_device: float | None = None
    tokens_per_s: float | None = None
    efficiency: float | None = None
    trials: int = 0
    """Completed trials of the size's study (measured rows)."""
    tflops_low: float | None = None
    tflops_high: float | None = None
    efficiency_low: float | None = None
    efficiency_high: float | None = None
    calibrated_on: str = ""
    """Predicted rows: the measured sizes the correction rests on (``""``: uncalibrated)."""
    layout: Layout | None = None
    """Predicted rows: the best layout itself (for the efficiency's band)."""
    energy_j_per_step: float | None = None
    energy_source: str | None = None
    joules_per_token: float | None = None
    model_tflops_per_watt: float | None = None
    note: str = ""
    """Predicted rows without a layout: why none is feasible at this size
    (:func:`autotune.planning.empty.no_layout_text`, the words ``run`` refuses such a
    size's study with)."""
    held: HeldPrediction | None = None
    """Predicted rows: the base size's best layout at this size (:mod:`.held`)."""


def _tokens_per_s(spec: StudySpec, tflops_per_device: float, devices: int) -> float:
    """Tokens per second of a model TFLOPS-per-device figure: the measured figures' own
    definition inverted (``trainer/measure.py``)."""
    gb = spec.training.global_batch
    per_token = model_flops_per_step(spec.model, gb) / (gb * spec.model.seq_len)
    return tflops_per_device * 1e12 * devices / per_token


def measured_rows(storage: Storage, spec: StudySpec, request: ScalingRequest,
                  ) -> list[ScalingRow]:
    """The best trial of each size's study that exists and has completed one."""
    import optuna

    from autotune.report.results import list_studies, selected_trial
    from autotune.storage import measured_value, trial_energy, trial_layout_key, trial_tokens_per_s

    have = set(list_studies(storage))
    rows = []
    for size in request.sizes:
        at = size_spec(spec, request, size)
        if at.name not in have:
            continue
        study = optuna.load_study(study_name=at.name, storage=storage.optuna)
        best = selected_trial(study)
        if best is None or best.value is None:
            continue
        energy = trial_energy(best)
        done = sum(1 for t in study.get_trials(deepcopy=False)
                   if measured_value(t) is not None)
        devices = request.devices(spec, size)
        rows.append(ScalingRow(
            size=size, nodes=at.cluster.nodes, devices=devices,
            global_batch=at.training.global_batch, mode=request.mode, source="measured",
            study=at.name, best_layout=trial_layout_key(best),
            model_tflops_per_device=float(best.value),
            tokens_per_s=trial_tokens_per_s(best) or _tokens_per_s(at, best.value, devices),
            trials=done, **energy))
    return rows


def _calibration(storage: Storage | None, spec: StudySpec, at: StudySpec,
                 request: ScalingRequest, below: Sequence[int]) -> Any:
    """The calibration of size ``at`` from the measured sizes ``below`` it (``None``
    without any)."""
    if storage is None or not below:
        return None
    from autotune.feasibility import Constraints
    from autotune.runner.learning import StudyLearning, key_of, own_rows, workload_of

    key = key_of(at, workload_of(at.launcher.kind))
    rows = [r for size in below
            for r in own_rows(storage, key, size_spec(spec, request, size).name)]
    if not rows:
        return None
    base = Constraints.from_configs(at.cluster, at.training, at.search, at.trial,
                                    profile=at.profile)
    return StudyLearning(at, base, key, rows).calibration


def judged_calibration(storage: Storage | None, at: StudySpec, below: Calibration | None,
                       ) -> tuple[Calibration | None, tuple[Layout, ...], tuple[Layout, ...]]:
    """The calibration a size is planned under: the memory correction (and the measured
    OOMs and runs) a run of ``at`` starts from, with the throughput correction of the
    smaller sizes ``below`` (or none): the prediction stays an extrapolation from them,
    while which layouts fit is what the run will say (module docstring; the campaign
    entries of ``--campaign-studies`` are judged by it too)."""
    if storage is None:
        return below, (), ()
    from autotune.models.calibration import LogCorrection
    from autotune.runner.learning import stored_calibration

    run, ooms, fits = stored_calibration(storage, at, learn=at.search.learn_from_database)
    judged = replace(run, throughput=below.throughput if below else LogCorrection(),
                     residuals=below.residuals if below else (), runs=())
    return judged, tuple(ooms), tuple(fits)


def predicted_rows(storage: Storage | None, spec: StudySpec, request: ScalingRequest,
                   measured: Sequence[ScalingRow] = ()) -> list[ScalingRow]:
    """The model's best layout and throughput at every size (module docstring)."""
    from autotune.planning.empty import no_layout_text
    from autotune.planning.plan import plan_study

    done = sorted(r.size for r in measured)
    out = []
    base: Layout | None = None  # the smallest size's best, held at the larger sizes
    for size in request.sizes:
        at = size_spec(spec, request, size)
        below = [s for s in done if s < size]
        cal = _calibration(storage, spec, at, request, below)
        judged, ooms, fits = judged_calibration(storage, at, cal)
        plan = plan_study(at, top=1, calibration=judged, ooms=ooms, fits=fits)
        devices = request.devices(spec, size)
        row = ScalingRow(size=size, nodes=at.cluster.nodes, devices=devices,
                         global_batch=at.training.global_batch, mode=request.mode,
                         source="predicted", study=at.name)
        if plan.rows:
            top = plan.rows[0]
            tflops = top.calibrated_tflops if cal is not None and top.calibrated_tflops \
                else top.step.model_tflops_per_device
            low, high = top.tflops_band if cal is None and top.tflops_band else (None, None)
            if cal is not None and cal.throughput.n:
                spread = math.exp(Z_95 * cal.throughput.sd)
                low, high = tflops / spread, tflops * spread
            row = replace(row, best_layout=top.layout.key(), model_tflops_per_device=tflops,
                          tokens_per_s=_tokens_per_s(at, tflops, devices),
                          tflops_low=low, tflops_high=high, layout=top.layout,
                          calibrated_on=",".join(str(s) for s in below) if cal else "")
        else:
            row = replace(row, note=no_layout_text(plan.empty_reasons))
        if base is None and row.layout is not None and spec.launcher.kind != "replay":
            base = row.layout  # a replayed table's rows are its space: nothing to hold
            row = replace(row, held=HeldPrediction(row.layout, row.model_tflops_per_device))
        elif base is not None:
            row = replace(row, held=predict_held(at, base, judged, calibrated=cal is not None,
                                                 ooms=ooms, fits=fits))
        out.append(row)
    return out


def efficiency_base(rows: Sequence[ScalingRow], request: ScalingRequest) -> int:
    """The size efficiency is against: the smallest with a throughput, measured or
    predicted (the request's smallest where no size has one)."""
    return min((r.size for r in rows if r.model_tflops_per_device is not None),
               default=request.base)


def with_efficiency(rows: Sequence[ScalingRow], request: ScalingRequest) -> list[ScalingRow]:
    """Each row's efficiency against the base size (:func:`efficiency_base`): measured rows
    and calibrated predictions against the base's measurement (its prediction where it was
    not measured); an uncalibrated prediction against the base's uncalibrated one (the
    cost model's own curve, whatever its absolute error)."""
    base = efficiency_base(rows, request)

    def figure(source: str, calibrated: bool | None = None) -> float | None:
        for r in rows:
            if r.size == base and r.source == source and (
                    calibrated is None or bool(r.calibrated_on) == calibrated):
                return r.model_tflops_per_device
        return None

    model_base = figure("predicted", False) or figure("predicted")
    measured_base = figure("measured") or model_base
    base_row = next((r for r in rows if r.size == base and r.source == "predicted"
                     and not r.calibrated_on), None)
    base_layout = base_row.layout if base_row is not None else None
    out = []
    for r in rows:
        uncalibrated = r.source == "predicted" and not r.calibrated_on
        ref = model_base if uncalibrated else measured_base
        is_base = r is base_row
        if r.held is not None and ref:
            # the ratio's band on the model's own curve, as the size's row has it
            r = replace(r, held=held_efficiency(
                r.held, ref, base_layout if uncalibrated and not is_base else None))
        if r.model_tflops_per_device is None or not ref:
            out.append(r)
            continue
        if uncalibrated and base_layout is not None and r.layout is not None:
            # The model's own curve: the band of the ratio, not of either prediction.
            low, high = (1.0, 1.0) if is_base else ratio_band(
                (base_layout, ref), (r.layout, r.model_tflops_per_device))
            out.append(replace(r, efficiency=scaling_efficiency(r.model_tflops_per_device, ref),
                               efficiency_low=low, efficiency_high=high))
            continue
        out.append(replace(
            r, efficiency=scaling_efficiency(r.model_tflops_per_device, ref),
            efficiency_low=scaling_efficiency(r.tflops_low, ref) if r.tflops_low else None,
            efficiency_high=scaling_efficiency(r.tflops_high, ref) if r.tflops_high else None))
    return out


def scaling_table(storage: Storage | None, spec: StudySpec, request: ScalingRequest, *,
                  predict: bool = True) -> list[ScalingRow]:
    """Measured and (with ``predict``) predicted rows, by size, measured first."""
    measured = measured_rows(storage, spec, request) if storage is not None else []
    predicted = predicted_rows(storage, spec, request, measured) if predict else []
    rows = sorted([*measured, *predicted], key=lambda r: (r.size, r.source != "measured"))
    return with_efficiency(rows, request)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _interval(low: float | None, high: float | None, fmt: str) -> str:
    if low is None or high is None:
        return ""
    return f" [{format(low, fmt)}-{format(high, fmt)}]"


def format_scaling(rows: Sequence[ScalingRow], request: ScalingRequest, *,
                   references: dict[int, float] | None = None) -> str:
    """The table for people: one line per size and source, then the energy of each
    measured size and the prediction errors at the measured sizes."""
    refs = references or {}
    head = ["nodes", "devices", "batch", "source", "best layout", "TFLOPS/dev",
            "tokens/s", f"{request.mode} eff.", "calibrated on"]
    if refs:
        head.append("reference")
    body = []
    for r in rows:
        tf = "-" if r.model_tflops_per_device is None else (
            f"{r.model_tflops_per_device:.4g}" + _interval(r.tflops_low, r.tflops_high, ".3g"))
        eff = _pct(r.efficiency)
        if r.efficiency_low is not None and r.efficiency_high is not None:
            eff += f" [{_pct(r.efficiency_low)}-{_pct(r.efficiency_high)}]"
        line = [r.nodes, r.devices, r.global_batch, r.source, r.best_layout or "-", tf,
                "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.4g}", eff,
                (f"sizes {r.calibrated_on}" if r.calibrated_on else
                 ("uncalibrated" if r.source == "predicted" else f"{r.trials} trials"))]
        if refs:
            line.append(f"{100 * refs[r.size]:.0f}%" if r.size in refs
                        and r.source == "predicted" else "")
        body.append(line)
    lines = [format_table(head, body)]
    base = efficiency_base(rows, request)
    if base != request.base:
        lines.append(f"efficiency against {request.axis} {base}, the smallest size with a "
                     "layout")
    lines += [f"{request.axis} {r.size}: {r.note}" for r in rows if r.note]
    held = [(r, r.held) for r in rows if r.source == "predicted" and r.held is not None]
    if any(h.layout is None or h.layout.key() != r.best_layout for r, h in held):
        lines += held_lines([(r.size, h) for r, h in held], request.axis)
    for r in rows:
        if r.source == "measured":
            lines.append(f"{request.axis} {r.size}: " + energy_text(
                r.energy_j_per_step, r.energy_source, r.joules_per_token))
    lines += [f"{request.axis} {m.size}: predicted {p.model_tflops_per_device:.4g} "
              f"TFLOPS/device from sizes {p.calibrated_on}, measured "
              f"{m.model_tflops_per_device:.4g}: error {_error(p, m):+.1%}"
              for m, p in prediction_pairs(rows)]
    return "\n".join(lines)


def prediction_pairs(rows: Sequence[ScalingRow]) -> list[tuple[ScalingRow, ScalingRow]]:
    """(measured, predicted) of each size with both, the prediction calibrated on smaller
    measured sizes."""
    pred = {r.size: r for r in rows if r.source == "predicted" and r.calibrated_on
            and r.model_tflops_per_device}
    return [(r, pred[r.size]) for r in rows if r.source == "measured" and r.size in pred
            and r.model_tflops_per_device]


def _error(pred: ScalingRow, meas: ScalingRow) -> float:
    """Relative error of the prediction: predicted / measured - 1."""
    assert pred.model_tflops_per_device and meas.model_tflops_per_device
    return pred.model_tflops_per_device / meas.model_tflops_per_device - 1.0


def _values(r: ScalingRow) -> tuple[object, ...]:
    """A row's values in the order of :data:`CSV_COLUMNS`."""
    return (r.nodes, r.devices, r.best_layout, r.model_tflops_per_device, r.tokens_per_s,
            r.efficiency, r.mode, r.source, r.global_batch, r.study, r.trials,
            r.tflops_low, r.tflops_high, r.efficiency_low, r.efficiency_high,
            r.calibrated_on, r.energy_j_per_step, r.energy_source, r.joules_per_token,
            r.model_tflops_per_watt, *held_values(r.held))


def scaling_csv(rows: Sequence[ScalingRow], request: ScalingRequest) -> str:
    """The table as CSV with :data:`CSV_COLUMNS` (empty cells: not known, never 0)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow(["" if v is None else v for v in _values(r)])
    return buf.getvalue()


def scaling_json(rows: Sequence[ScalingRow], request: ScalingRequest) -> str:
    """The table as JSON: the request, the size efficiency is against
    (``efficiency_base``), why the sizes without a layout have none (``no_layout``: size
    to reason) and one object per row with the CSV's columns (``null``: not known)."""
    import json

    return json.dumps({"mode": request.mode, "axis": request.axis,
                       "sizes": list(request.sizes),
                       "efficiency_base": efficiency_base(rows, request),
                       "no_layout": {str(r.size): r.note for r in rows if r.note},
                       "held": [held_json(r.held, nodes=r.nodes, devices=r.devices)
                                for r in rows if r.source == "predicted" and r.held],
                       "rows": [dict(zip(CSV_COLUMNS, _values(r), strict=True))
                                for r in rows]}, indent=2, default=str)
