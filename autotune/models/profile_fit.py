"""Layer times from measured steps: the fit behind :class:`~autotune.models.profile.LayerProfile`.

In 1F1B with ``m`` micro-batches over ``p`` stages the critical path of a step holds
``(m + p - 1) * ceil(L / p)`` layer-micro-batch slots (Narayanan et al. 2021, section
2.2.1), so the slope of step time over that count is one layer's time for one
micro-batch; embeddings, logits, the optimizer and per-step overheads fall elsewhere
(:func:`_series_time`). Samples come from ``autotune profile``'s trainer runs
(:mod:`autotune.profiling.layers`) or from a published table (:func:`landscape_samples`).

Where the samples also carry their measured peak memory (``autotune profile``'s runs, with
``pp = dp = 1`` and ZeRO 0), the slope of the peak over the layer count is one layer's
bytes, states plus the activations of one micro-batch (:func:`_series_layer_bytes`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from autotune.config.model import ModelConfig
from autotune.hardware import HARDWARE
from autotune.layout import Layout
from autotune.models.links import tp_link
from autotune.models.profile import LayerMemory, LayerProfile, LayerShape, ProfileEntry
from autotune.models.stragglers import straggler_factor

if TYPE_CHECKING:
    from autotune.landscape import LandscapeGroup

__all__ = ["LayerSample", "layer_slots", "fit_layer_profile", "landscape_samples",
           "median_standard_error"]


def layer_slots(n_layer: int, layout: Layout) -> int:
    """Layer-micro-batch slots on a 1F1B step's critical path: ``(m + p - 1) ceil(L/p)``
    (Narayanan et al. 2021, section 2.2.1, equal stages)."""
    return (layout.grad_accum + layout.pp - 1) * math.ceil(n_layer / layout.pp)


@dataclass(frozen=True)
class LayerSample:
    """One measured step: the job and its step time."""

    model: ModelConfig
    layout: Layout
    device: str
    dtype: str
    tp_link: str
    step_time_s: float
    step_time_se_s: float | None = None
    """Standard error of ``step_time_s`` (:func:`median_standard_error` of the timed
    steps), when known: it gives the fitted layer time its error bar."""
    peak_memory_bytes: int | None = None
    """The run's measured peak memory per device (the trainer's ``peak_memory_bytes``),
    when known: with ``pp = dp = 1`` and ZeRO 0 it gives the layer's bytes."""
    memory_peak: str = "allocated"
    """What ``peak_memory_bytes`` is (:data:`autotune.models.profile.PEAK_KINDS`)."""


def landscape_samples(groups: Iterable[LandscapeGroup]) -> list[LayerSample]:
    """The ``ok`` rows of measured landscape groups that report a step time."""
    return [LayerSample(g.model, m.layout, g.cluster.device, g.dtype,
                        tp_link(m.layout, g.cluster), m.iteration_time_s)
            for g in groups for m in g.ok() if m.iteration_time_s]


class _Point(NamedTuple):
    slots: int
    stage_layers: int
    micro_batches: int
    step_s: float
    se_s: float | None
    """Standard error of ``step_s``, when the steps behind it are known."""
    peak_bytes: float | None = None
    """Measured peak memory (median over repeats), when every repeat has one."""


def _series_time(points: list[_Point]) -> tuple[float, float | None] | None:
    """Layer time (and its standard error) from one series of measured steps.

    With both the layer count and the micro-batch count varied (``autotune profile``'s
    2 x 2 design), least squares on ``T = t * slots + o * stage_layers + c * m + k``
    separates the layer time ``t`` from per-layer work done once per step (the optimizer
    step over the layer's weights, its gradient reduction; the cost model charges those
    itself) and per-micro-batch work outside the layers (embeddings, logits, loss). With
    the layer count alone varied (a published table), ``T = t' * slots + k``: ``t'`` then
    also holds ``o / m``, which is small at the accumulation such tables use.

    Either estimate is linear in the step times, ``t = sum c_i T_i``, so its standard
    error is ``sqrt(sum (c_i se_i)^2)`` when every point has one.
    """
    full = np.array([[p.slots, p.stage_layers, p.micro_batches, 1.0] for p in points])
    if np.linalg.matrix_rank(full) == 4:
        xs = full
    elif len({p.slots for p in points}) >= 2 and len({p.micro_batches for p in points}) == 1:
        xs = full[:, [0, 3]]
    else:
        return None
    weights = np.linalg.pinv(xs)[0]  # t = weights @ step times
    t = float(weights @ np.array([p.step_s for p in points]))
    ses = [p.se_s for p in points]
    if any(v is None for v in ses):
        return t, None
    return t, float(math.sqrt(sum((w * v) ** 2
                                  for w, v in zip(weights, ses, strict=True))))


def _series_layer_bytes(points: list[_Point]) -> tuple[float, float | None] | None:
    """One layer's bytes (and their standard error) from one series' measured peaks.

    With ``pp = 1`` the micro-batches of a step run one after another, so the peak holds
    one micro-batch's activations whatever the accumulation, and every layer adds the same
    bytes: ``P(L, m) = B L + k_m``. Each accumulation ``m`` measured at two or more layer
    counts gives a slope ``B_m`` (least squares over ``L``); ``B`` is their mean. What
    separates them is noise (CPU: the resident set's run-to-run variation) and whether the
    previous micro-batch's gradients are resident beside the activations at the peak
    (with ``m = 1`` they are not yet, with ``m >= 2`` they are), so their spread is the
    error bar: ``sd(B_m) / sqrt(k)`` over ``k >= 2`` accumulations, i.e. half the
    difference of the two slopes in ``autotune profile``'s 2 x 2 design (its interaction
    contrast). ``None`` without two layer counts at one accumulation.
    """
    slopes = []
    for m in sorted({p.micro_batches for p in points}):
        same = [p for p in points if p.micro_batches == m and p.peak_bytes is not None]
        if len({p.stage_layers for p in same}) < 2:
            continue
        layers = np.array([p.stage_layers for p in same], dtype=float)
        peaks = np.array([p.peak_bytes for p in same], dtype=float)
        slopes.append(float(np.polyfit(layers, peaks, 1)[0]))
    if not slopes:
        return None
    mean = statistics.fmean(slopes)
    if len(slopes) < 2:
        return mean, None
    return mean, statistics.stdev(slopes) / math.sqrt(len(slopes))


def median_standard_error(step_times_s: Sequence[float]) -> float | None:
    """Standard error of the median of ``n`` timed steps, ``1.2533 sd / sqrt(n)`` (the
    large-sample value for normal noise); ``None`` below 2 steps."""
    n = len(step_times_s)
    if n < 2:
        return None
    return 1.2533 * statistics.stdev(step_times_s) / math.sqrt(n)


def _pooled_se(ses: Sequence[float | None]) -> float | None:
    """Error of the median of ``k`` values each known to ``se``: treated like their mean's,
    ``median(se) / sqrt(k)`` (an estimate); ``None`` if any is unknown."""
    known = [v for v in ses if v is not None]
    if not known or len(known) < len(ses):
        return None
    return statistics.median(known) / math.sqrt(len(known))


def fit_layer_profile(samples: Iterable[LayerSample], *, source: str = "") -> LayerProfile:
    """Layer times from steps measured at several layer counts (see the module docstring).

    Samples that differ only in the number of layers (and, for ``autotune profile``'s
    runs, in the number of micro-batches) form one series; a series gives one layer time
    (:func:`_series_time`). Each layer shape gets the median over its series (robust to
    one noisy series) and the spread between them. Non-positive times (noise swamping a
    tiny layer) are dropped; a shape left without any is not in the profile.

    Series run with ``pp = dp = 1`` and ZeRO 0 whose samples all carry a measured peak
    also give the layer's bytes (:func:`_series_layer_bytes`; the median over series, the
    pooled error bar), stored as the entry's ``memory``; a non-positive slope gives none.
    The memory rides on the time: a shape without a layer time has no entry to hold it.
    """
    series: dict[tuple[Any, ...], dict[tuple[int, int, int], list[LayerSample]]] = (
        defaultdict(lambda: defaultdict(list)))
    for s in samples:
        if not (s.step_time_s > 0 and math.isfinite(s.step_time_s)):
            continue
        shape = LayerShape.of(s.model, s.layout, device=s.device, dtype=s.dtype,
                              tp_link=s.tp_link)
        lay = s.layout
        # One series: everything but the layer count and the accumulation, which the fit
        # varies. The vocabulary, pipeline, replicas and ZeRO stage change what is outside
        # the layers (the intercepts), so runs that differ in them are separate series.
        key = (shape, s.model.vocab_size, lay.pp, lay.dp, lay.zero_stage)
        stage_layers = math.ceil(s.model.n_layer / lay.pp)
        point = (layer_slots(s.model.n_layer, lay), stage_layers, lay.grad_accum)
        series[key][point].append(s)
    times: dict[LayerShape, list[tuple[float, float | None]]] = defaultdict(list)
    layer_bytes: dict[LayerShape, list[tuple[float, float | None]]] = defaultdict(list)
    peak_kind: dict[LayerShape, str] = {}
    for key, by_point in series.items():
        points = [_Point(*pt, statistics.median(x.step_time_s for x in same),
                         _pooled_se([x.step_time_se_s for x in same]), _median_peak(same))
                  for pt, same in sorted(by_point.items())]
        _, _, pp, dp, zero = key
        kinds = {x.memory_peak for same in by_point.values() for x in same}
        if (pp, dp, zero) == (1, 1, 0) and len(kinds) == 1:
            # Only the profile's own design: with a pipeline, replicas or ZeRO the layers'
            # bytes are split and in flight in ways the states/activations split (at
            # pp = dp = 1, ZeRO 0) does not describe.
            fitted = _series_layer_bytes(points)
            if fitted is not None and fitted[0] > 0:
                layer_bytes[key[0]].append(fitted)
                peak_kind[key[0]] = kinds.pop()
        # A slope at rounding level (a series flat within float precision) is no
        # measurement of a layer: keep only times above a millionth of the step.
        floor = 1e-6 * max(p.step_s for p in points)
        whole = _series_time(points)
        # Without the four distinct points the full fit needs, yet several accumulations,
        # each accumulation is a series of its own.
        fits = [whole] if whole is not None else [
            _series_time([p for p in points if p.micro_batches == m])
            for m in sorted({p.micro_batches for p in points})]
        # The steps waited for the slowest of their devices; the profile holds the median
        # device's layer, which estimate_step slows again for the world it predicts.
        slowest = _slowest_of(next(iter(by_point.values()))[0])
        kept = [(f[0] / slowest, None if f[1] is None else f[1] / slowest)
                for f in fits if f is not None and f[0] > floor]
        if kept:
            times[key[0]] += kept
    entries = []
    for shape in sorted(times):
        vals = [t for t, _ in times[shape]]
        ses = [se for _, se in times[shape]]
        med = statistics.median(vals)
        se = _pooled_se(ses)
        entries.append(ProfileEntry(shape, med, len(vals), (max(vals) - min(vals)) / med,
                                    stderr_s=se, memory=_layer_memory(
                                        layer_bytes.get(shape), peak_kind.get(shape))))
    return LayerProfile(tuple(entries), source=source)


def _slowest_of(sample: LayerSample) -> float:
    """How much longer the sample's device kernels took than the median device's: the
    slowest of its world (:func:`autotune.models.stragglers.straggler_factor`; 1 for a
    device the hardware table does not know or gives no spread)."""
    spec = HARDWARE.get(sample.device)
    return straggler_factor(sample.layout.world_size, spec.speed_sd if spec else 0.0)


def _median_peak(same: list[LayerSample]) -> float | None:
    """Median measured peak of the repeats of one point; ``None`` unless all have one."""
    peaks = [x.peak_memory_bytes for x in same]
    if any(p is None or p <= 0 for p in peaks):
        return None
    return float(statistics.median(p for p in peaks if p is not None))


def _layer_memory(fits: list[tuple[float, float | None]] | None,
                  peak: str | None) -> LayerMemory | None:
    """A shape's bytes over its series: the median, with the pooled error bar."""
    if not fits or peak is None:
        return None
    return LayerMemory(statistics.median(b for b, _ in fits),
                       _pooled_se([se for _, se in fits]), peak)
