"""Layer times from measured steps: the fit behind :class:`~autotune.models.profile.LayerProfile`.

In 1F1B with ``m`` micro-batches over ``p`` stages the critical path of a step holds
``(m + p - 1) * ceil(L / p)`` layer-micro-batch slots (Narayanan et al. 2021, section
2.2.1), so the slope of step time over that count is one layer's time for one
micro-batch; embeddings, logits, the optimizer and per-step overheads fall elsewhere
(:func:`_series_time`). Samples come from ``autotune profile``'s trainer runs
(:mod:`autotune.profiling`) or from a published table (:func:`landscape_samples`).
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
from autotune.layout import Layout
from autotune.models.cost import tp_link
from autotune.models.profile import LayerProfile, LayerShape, ProfileEntry

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
    for key, by_point in series.items():
        points = [_Point(*pt, statistics.median(x.step_time_s for x in same),
                         _pooled_se([x.step_time_se_s for x in same]))
                  for pt, same in sorted(by_point.items())]
        # A slope at rounding level (a series flat within float precision) is no
        # measurement of a layer: keep only times above a millionth of the step.
        floor = 1e-6 * max(p.step_s for p in points)
        whole = _series_time(points)
        # Without the four distinct points the full fit needs, yet several accumulations,
        # each accumulation is a series of its own.
        fits = [whole] if whole is not None else [
            _series_time([p for p in points if p.micro_batches == m])
            for m in sorted({p.micro_batches for p in points})]
        kept = [f for f in fits if f is not None and f[0] > floor]
        if kept:
            times[key[0]] += kept
    entries = []
    for shape in sorted(times):
        vals = [t for t, _ in times[shape]]
        ses = [se for _, se in times[shape]]
        med = statistics.median(vals)
        se = _pooled_se(ses)
        entries.append(ProfileEntry(shape, med, len(vals), (max(vals) - min(vals)) / med,
                                    stderr_s=se))
    return LayerProfile(tuple(entries), source=source)
