"""The base size's layout held at every size: what scaling does to one layout.

The scaling table's predicted rows take each size's own best layout, so where the best
changes with the size (ZeRO sharding the states over more replicas frees the memory to
drop recompute or pipeline stages: Rajbhandari et al. 2020, ZeRO, section 10.3) their
efficiency mixes two things: what the larger cluster costs a layout, and what a layout
the smaller one cannot hold buys. This module predicts the other half: the base size's
best layout with only ``dp`` (the replicas) and ``grad_accum`` (the size's batch) changed,
checked and predicted as ``autotune plan`` checks and predicts a study of that size (the
same space code, restricted to the layout's axes), so the difference between the two
curves reads off the table. It is what the centre's "same job on more nodes" measures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autotune.layout import Layout
from autotune.planning.band import ratio_band
from autotune.scaling.sizes import scaling_efficiency
from autotune.spec import StudySpec

if TYPE_CHECKING:
    from autotune.models.calibration import Calibration

__all__ = ["HeldPrediction", "HELD_CSV_COLUMNS", "held_spec", "predict_held",
           "held_efficiency", "held_json", "held_values", "held_lines"]

HELD_CSV_COLUMNS = ("held_layout", "held_model_tflops_per_device", "held_efficiency",
                    "held_efficiency_low", "held_efficiency_high", "held_note")
"""The held curve's columns of a predicted row in the scaling CSV (after the table's own):
a spreadsheet of ``plan --scaling --format csv`` carries both curves, as the text does."""


@dataclass(frozen=True)
class HeldPrediction:
    """The base layout at one size: its layout there and predicted model TFLOPS per
    device, or why it cannot run there (``note``)."""

    layout: Layout | None
    tflops: float | None
    note: str = ""
    efficiency: float | None = None
    efficiency_low: float | None = None
    efficiency_high: float | None = None


def held_spec(at: StudySpec, layout: Layout) -> StudySpec:
    """``at`` (one size's study) with its search space cut to ``layout``'s axes: every
    axis but ``dp`` (the size's world) and ``grad_accum`` (the size's batch) held."""
    search = replace(
        at.search, tp=(layout.tp,), pp=(layout.pp,), micro_batch=(layout.micro_batch,),
        zero_stage=(layout.zero_stage,), recompute=(layout.recompute,),
        sequence_parallel=(layout.sequence_parallel,), zero_variant=(layout.zero_variant,),
        zero_shard_size=(layout.zero_shard,) if layout.zero_variant != "none" else None,
        ulysses=(layout.ulysses,))
    return replace(at, search=search)


def predict_held(at: StudySpec, layout: Layout, calibration: Calibration | None, *,
                 calibrated: bool, ooms: tuple[Layout, ...] = (),
                 fits: tuple[Layout, ...] = ()) -> HeldPrediction:
    """``layout`` (the base size's best) at the size of ``at``, under the calibration that
    size's own prediction uses (``calibrated``: its throughput correction applies)."""
    from autotune.planning.empty import no_layout_text
    from autotune.planning.plan import plan_study

    plan = plan_study(held_spec(at, layout), top=1, calibration=calibration, ooms=ooms,
                      fits=fits)
    if not plan.rows:
        return HeldPrediction(None, None, note=no_layout_text(plan.empty_reasons))
    top = plan.rows[0]
    tflops = top.calibrated_tflops if calibrated and top.calibrated_tflops \
        else top.step.model_tflops_per_device
    return HeldPrediction(top.layout, tflops)


def held_efficiency(held: HeldPrediction, ref: float, base: Layout | None) -> HeldPrediction:
    """``held`` with its efficiency against ``ref`` (the base size's figure) and, on the
    cost model's own curve (``base``: the base size's layout; ``None`` at the base size
    itself and on calibrated rows), the 90% band of that ratio
    (:func:`~autotune.planning.band.ratio_band`, as the table's own column)."""
    if held.tflops is None or held.layout is None:
        return held
    low, high = ratio_band((base, ref), (held.layout, held.tflops)) if base is not None \
        else (None, None)
    return replace(held, efficiency=scaling_efficiency(held.tflops, ref),
                   efficiency_low=low, efficiency_high=high)


def held_json(held: HeldPrediction, *, nodes: int, devices: int) -> dict[str, Any]:
    """One size of the held curve for ``plan --scaling --format json``."""
    return {"nodes": nodes, "devices": devices,
            "layout": held.layout.key() if held.layout is not None else None,
            "model_tflops_per_device": held.tflops, "efficiency": held.efficiency,
            "efficiency_low": held.efficiency_low, "efficiency_high": held.efficiency_high,
            "note": held.note}


def held_values(held: HeldPrediction | None) -> tuple[object, ...]:
    """A row's :data:`HELD_CSV_COLUMNS` (``None``: not known; measured rows have none)."""
    if held is None:
        return (None,) * len(HELD_CSV_COLUMNS)
    return (held.layout.key() if held.layout is not None else None, held.tflops,
            held.efficiency, held.efficiency_low, held.efficiency_high, held.note or None)


def held_lines(rows: list[tuple[int, HeldPrediction]], axis: str) -> list[str]:
    """The held curve under the scaling table: a heading, then one line per size."""
    lines = [f"{axis} {rows[0][0]}'s best layout held at every size (dp and grad_accum "
             f"follow the size): what the size costs one layout; the table lets each size "
             f"choose its own"]
    for size, held in rows:
        if held.tflops is None or held.layout is None:
            lines.append(f"  {axis} {size}: cannot run: {held.note}")
            continue
        eff = "-" if held.efficiency is None else f"{100 * held.efficiency:.1f}%"
        if held.efficiency_low is not None and held.efficiency_high is not None:
            eff += f" [{100 * held.efficiency_low:.0f}%-{100 * held.efficiency_high:.0f}%]"
        lines.append(f"  {axis} {size}: {held.layout.key()} {held.tflops:.4g} "
                     f"TFLOPS/dev, efficiency {eff}")
    return lines
