"""Calibration from measurements: how far the memory and step-time models were off on the
layouts measured so far, and what that says of the untried ones.

Per *key* (:class:`CalibrationKey`: device type, dtype, workload) each model gets one
correction in log space, shared by every layout of the key (the memory one refined per
ZeRO stage, below). Pure arithmetic: the rows come from the ``measurements`` table
(:mod:`autotune.runner.learning` reads them), the results go into
:class:`~autotune.feasibility.MemoryBudget` and the default strategy's prior.

**Memory.** ``u = ln(c)``, ``c`` = true peak / predicted peak. An ``ok`` trial observes
``r = ln(measured / predicted)``; an OOM only says that its peak exceeded the usable memory
``U``: ``r > b = ln(U / predicted)``, a *censored* observation. With the prior ``u ~ N(m0,
s0^2)`` and ``r_i = u + e_i``, ``e_i ~ N(0, t^2)`` independent,

    p(u | data)  ∝  N(u; m0, s0^2) · prod_ok N(r_i; u, t^2) · prod_oom Phi((u - b_j) / t)

which is not Gaussian once an OOM is in it, so :func:`fit_memory` evaluates it on a grid
and reports its mean and sd. ``s0`` and ``t`` are the memory model's own stated error for
the study's layouts (the median log-sd of :mod:`~autotune.models.memory_uncertainty`):
before any measurement the correction may be off by as much as the model says it may be,
and one layout measured says about as much of the shared correction as the prior does
(one measurement moves it halfway). An OOM where the model expected room (``b > 0``)
pushes the correction up hard; one it expected (``b < m0``) barely moves it.

**Per ZeRO stage.** The memory model's largest unknowns are the optimizer wrapper
DeepSpeed picks and its buffers (the gradient accumulation and flat partition terms of
:mod:`~autotune.models.memory_uncertainty`), and the wrapper is chosen by the ZeRO stage:
on CPU, ZeRO-0 layouts measure ~0.78 of their prediction where ZeRO-1 layouts measure
~1.03 (docs/models.md). So each stage ``z`` has its own correction ``u_z``: its prior is
the correction fitted on the *other* stages' points, carried over (below) with the
correlation :data:`STAGE_CORRELATION`, then its own points update it. A stage nothing has
measured takes half the others' correction; an error the stages share (an OOM on any
stage) moves every stage, and a stage's own measurements soon decide its own.

**Step time.** The same shape with ``y = ln(measured TFLOPS / predicted TFLOPS)`` =
``ln(predicted step time / measured step time)`` (model TFLOPS is the model's FLOPs over
the step time: the ratio of the one is the inverse ratio of the other), conjugate-normal
(:func:`fit_throughput`): prior sd :data:`THROUGHPUT_PRIOR_SD` and noise
:data:`THROUGHPUT_NOISE_SD`, the default strategy's prior on its intercept (the overall
scale error) and its per-layout sd. This factor is the plan's and the trial records'
calibrated throughput; the default strategy learns more (per-axis corrections) from the
same residuals (:class:`Residual`, its warm start).

**Across studies** (:func:`carry_over`): what earlier studies of the key learned becomes
the new study's prior, but not one for one (another model, another world size). The
correction is taken to move between two studies as a stationary autoregression around
the fresh prior ``N(m0, s0^2)``, ``u_new = m0 + rho · (u_old - m0) + sqrt(1 - rho^2) · xi``
with ``xi ~ N(0, s0^2)`` and ``rho`` = :data:`STUDY_CORRELATION`: the prior mean is ``m0 +
rho · (mean - m0)``, its variance ``rho^2 · sd^2 + (1 - rho^2) · s0^2``. A correction the
earlier studies knew well keeps at least ``sqrt(1 - rho^2)`` = 44% of the fresh prior's
width; one they did not inform stays the fresh prior exactly (no widening beyond it).

>>> ok = [MemoryPoint(1000.0, measured_bytes=900.0)] * 4
>>> round(fit_memory(ok, prior_sd=0.1, noise_sd=0.1).factor, 3)  # 4 of 5 parts the data's
0.919
>>> oom = [MemoryPoint(1000.0, exceeded_bytes=1100.0)]  # predicted 10% below, ran out
>>> round(fit_memory(oom, prior_sd=0.1, noise_sd=0.1).factor, 3)  # the correction rises
1.094
>>> round(fit_memory([MemoryPoint(1000.0, exceeded_bytes=800.0)], prior_sd=0.1,
...                  noise_sd=0.1).factor, 3)  # an OOM the model expected: barely
1.009
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.layout import Layout
from autotune.models.evidence import (
    STUDY_CORRELATION,
    carry_over_gaussian,
)
from autotune.models.prediction_spread import SCALE_SD, scale_sd

__all__ = ["BUILTIN_WORKLOAD", "STUDY_CORRELATION", "STAGE_CORRELATION", "THROUGHPUT_PRIOR_SD",
           "THROUGHPUT_NOISE_SD", "CalibrationKey", "LogCorrection", "MemoryPoint",
           "MeasuredRow", "Residual", "Calibration", "fit_memory", "fit_throughput",
           "carry_over", "carry_over_gaussian", "comparable_peak_bytes", "calibrate"]

BUILTIN_WORKLOAD = "builtin"
"""The workload of the built-in trainer (``trainer/``): every local and SLURM trial today."""

STAGE_CORRELATION = 0.5
"""How much of the memory correction two ZeRO stages share: half. Some of the model's
unknowns are the same on every stage (the runtime, activations, fragmentation), others
are the stage's own (the optimizer wrapper DeepSpeed picks for it, its buffers); with no
way to know the split beforehand, each half. A generic statement, not fitted."""

THROUGHPUT_PRIOR_SD = SCALE_SD
"""Prior sd of the log throughput correction on a validated device (the strategy's
``INTERCEPT_SD``); :func:`calibrate` takes its device's, ``prediction_spread.scale_sd``."""

THROUGHPUT_NOISE_SD = 0.2
"""Per-layout sd of a log throughput residual around the shared correction: the default
strategy's ``LAYOUT_SD`` (interactions a shared correction cannot explain)."""

_GRID_POINTS = 4001
_GRID_HALF_WIDTH_SD = 10.0
_CHUNK = 512  # censored points per grid evaluation (4001 x 512 floats: 16 MB)


@dataclass(frozen=True)
class CalibrationKey:
    """What a correction belongs to: measurements of one device type, in one dtype, of
    one workload (``builtin``: the built-in trainer; a replayed table is ``replay``)."""

    device_type: str
    dtype: str
    workload: str = BUILTIN_WORKLOAD


@dataclass(frozen=True)
class LogCorrection:
    """A fitted correction: mean and sd of ``ln(true / predicted)`` and what it rests on."""

    mean: float = 0.0
    sd: float = 0.0
    n_ok: int = 0
    """Measured values it was fitted on (peaks, or throughputs)."""
    n_censored: int = 0
    """Out-of-memory lower bounds it was fitted on (memory only)."""

    @property
    def n(self) -> int:
        return self.n_ok + self.n_censored

    @property
    def factor(self) -> float:
        """``exp(mean)``: the multiplicative correction (the median of ``true/predicted``)."""
        return math.exp(self.mean)


@dataclass(frozen=True)
class MemoryPoint:
    """One trial's memory observation: a measured peak, or (an OOM) the usable memory its
    peak exceeded. Both in the memory model's terms (:func:`comparable_peak_bytes`)."""

    predicted_bytes: float
    measured_bytes: float | None = None
    exceeded_bytes: float | None = None
    zero_stage: int = 0
    """The layout's ZeRO stage (its group in the per-stage corrections)."""

    def __post_init__(self) -> None:
        if (self.measured_bytes is None) == (self.exceeded_bytes is None):
            raise ValueError("MemoryPoint: give exactly one of measured_bytes (an ok trial) "
                             "and exceeded_bytes (an out-of-memory trial)")
        values = (self.predicted_bytes, self.measured_bytes or self.exceeded_bytes)
        if not all(v is not None and v > 0 and math.isfinite(v) for v in values):
            raise ValueError(f"MemoryPoint: bytes must be positive and finite, got {values}")

    @property
    def log_ratio(self) -> float:
        """``r`` of an ok trial, or the lower bound ``b`` of an OOM's."""
        value = self.measured_bytes if self.measured_bytes is not None else self.exceeded_bytes
        assert value is not None
        return math.log(value / self.predicted_bytes)


def _log_norm_cdf(z: np.ndarray) -> np.ndarray:
    """``ln Phi(z)``, accurate far into the lower tail (where ``Phi`` underflows)."""
    from scipy.special import log_ndtr  # local: scipy is a dependency, its import is slow

    return np.asarray(log_ndtr(z), dtype=float)


def fit_memory(points: Iterable[MemoryPoint], *, prior_mean: float = 0.0, prior_sd: float,
               noise_sd: float) -> LogCorrection:
    """The grid posterior of the log memory correction (module docstring): evaluated over
    the span of the prior and the points, then once more over its mean +- 12 sd, so that a
    posterior narrower than the first grid's step (thousands of points) is resolved."""
    points = list(points)
    if prior_sd <= 0 or noise_sd <= 0:
        raise ValueError(f"fit_memory: sds must be positive, got {prior_sd}, {noise_sd}")
    ok = np.array([p.log_ratio for p in points if p.measured_bytes is not None])
    bounds = np.array([p.log_ratio for p in points if p.exceeded_bytes is not None])
    if not len(ok) and not len(bounds):
        return LogCorrection(prior_mean, prior_sd)

    def moments(lo: float, hi: float) -> tuple[float, float, float]:
        grid = np.linspace(lo, hi, _GRID_POINTS)
        log_post = -0.5 * ((grid - prior_mean) / prior_sd) ** 2
        if len(ok):  # sum_i (u - r_i)^2 from the points' count, sum and sum of squares
            log_post -= 0.5 * (len(ok) * grid**2 - 2 * grid * ok.sum()
                               + (ok**2).sum()) / noise_sd**2
        for start in range(0, len(bounds), _CHUNK):  # a grid x points array, bounded
            chunk = bounds[start:start + _CHUNK]
            log_post += _log_norm_cdf((grid[:, None] - chunk[None, :]) / noise_sd).sum(axis=1)
        weights = np.exp(log_post - log_post.max())
        weights /= weights.sum()
        mean = float(weights @ grid)
        return mean, float(math.sqrt(max(weights @ (grid - mean) ** 2, 0.0))), grid[1] - grid[0]

    anchors = np.concatenate([[prior_mean], ok, bounds])
    width = _GRID_HALF_WIDTH_SD * max(prior_sd, noise_sd)
    mean, sd, step = moments(anchors.min() - width, anchors.max() + width)
    span = 12.0 * max(sd, 2.0 * step)
    mean, sd, _ = moments(mean - span, mean + span)
    return LogCorrection(mean, sd, n_ok=len(ok), n_censored=len(bounds))


def fit_throughput(log_ratios: Iterable[float], *, prior_mean: float = 0.0,
                   prior_sd: float = THROUGHPUT_PRIOR_SD,
                   noise_sd: float = THROUGHPUT_NOISE_SD) -> LogCorrection:
    """The conjugate-normal posterior of the log throughput correction from ``ln(measured
    / predicted)`` of ``ok`` trials: precision-weighted mean of prior and data."""
    ys = [float(y) for y in log_ratios if math.isfinite(y)]
    precision = 1.0 / prior_sd**2 + len(ys) / noise_sd**2
    mean = (prior_mean / prior_sd**2 + sum(ys) / noise_sd**2) / precision
    return LogCorrection(mean, math.sqrt(1.0 / precision), n_ok=len(ys))


def carry_over(earlier: LogCorrection, fresh_sd: float, *, fresh_mean: float = 0.0,
               rho: float = STUDY_CORRELATION) -> tuple[float, float]:
    """The new study's prior (mean, sd) from what earlier studies learned (module
    docstring); the fresh prior ``(fresh_mean, fresh_sd)`` when they learned nothing."""
    if earlier.n == 0:
        return fresh_mean, fresh_sd
    var = rho**2 * earlier.sd**2 + (1.0 - rho**2) * fresh_sd**2
    return fresh_mean + rho * (earlier.mean - fresh_mean), math.sqrt(var)


def comparable_peak_bytes(peak_bytes: float, device: str) -> float:
    """A measured peak in the memory model's terms.

    On CPU the trainer reports the peak resident set, which holds the interpreter, torch
    and the allocator's retention like the model's ``cpu`` runtime allowance does. On an
    accelerator it reports the caching allocator's peak *allocated* bytes, which leave out
    what the model's runtime allowance stands for (the device context, the collectives'
    channel buffers, library workspaces: allocated outside the caching allocator), so the
    allowance is added back (:func:`autotune.models.memory.runtime_bytes`).
    """
    from autotune.models.memory import runtime_bytes

    return float(peak_bytes) if device == "cpu" else float(peak_bytes) + runtime_bytes(device)


@dataclass(frozen=True)
class MeasuredRow:
    """What calibration reads of one ``measurements`` row (an ``ok`` or ``oom`` trial)."""

    study: str
    layout: Layout
    oom: bool
    predicted_memory_bytes: float | None = None
    peak_memory_bytes: float | None = None  # as reported: comparable_peak_bytes converts it
    predicted_tflops: float | None = None
    measured_tflops: float | None = None


@dataclass(frozen=True)
class Residual:
    """One earlier ``ok`` trial's throughput residual, for the default strategy's prior."""

    layout: Layout
    log_ratio: float
    """``ln(measured / predicted)`` model TFLOPS per device."""
    log_prediction: float
    """``ln(predicted)`` less the mean over its own study's rows (the residual model's
    calibration-slope feature, centred within the study it came from)."""


@dataclass(frozen=True)
class Calibration:
    """Both corrections of one study: the earlier studies' carried over, then refitted on
    the study's own trials."""

    key: CalibrationKey
    memory: LogCorrection = LogCorrection()
    """Posterior of the log memory correction (``n``: earlier and own observations)."""
    memory_by_stage: tuple[tuple[int, LogCorrection], ...] = ()
    """Per ZeRO stage (module docstring): each ``n`` counts that stage's own points."""
    throughput: LogCorrection = LogCorrection()
    """Posterior of the log throughput correction."""
    learned_from: tuple[tuple[str, int], ...] = ()
    """Earlier studies the warm start used, each with its number of rows."""
    own: int = 0
    """Rows of the study itself in the fit."""
    residuals: tuple[Residual, ...] = ()
    """The earlier studies' throughput residuals (the default strategy's warm start)."""
    runs: tuple[tuple[Layout, float], ...] = ()
    """The study's own ``ok`` trials, (layout, measured model TFLOPS): its history."""
    stale: int = 0
    """Earlier rows left out: other models predicted them (:mod:`autotune.models.version`)."""

    @property
    def memory_factor(self) -> float:  # the predicted peak's; 1 until something measured
        return self.memory.factor if self.memory.n else 1.0

    @property
    def memory_sd(self) -> float:
        """sd of the log memory correction; 0 until measured (the model's error alone)."""
        return self.memory.sd if self.memory.n else 0.0

    def memory_stage_corrections(self) -> tuple[tuple[int, float, float], ...]:
        """``(zero stage, factor, log-sd)`` of each stage (memory budget); none unmeasured."""
        return tuple((z, c.factor, c.sd) for z, c in self.memory_by_stage) if self.memory.n \
            else ()

    @property
    def throughput_factor(self) -> float:
        """measured / predicted model TFLOPS, the median; 1 until something was measured."""
        return self.throughput.factor if self.throughput.n else 1.0


def _memory_points(rows: Iterable[MeasuredRow], usable_bytes: float | None,
                   device: str) -> list[MemoryPoint]:
    out = []
    for row in rows:
        pred = row.predicted_memory_bytes
        if not pred or pred <= 0:
            continue
        stage = row.layout.zero_stage
        if row.oom:
            if usable_bytes:
                out.append(MemoryPoint(pred, exceeded_bytes=usable_bytes, zero_stage=stage))
        elif row.peak_memory_bytes and row.peak_memory_bytes > 0:
            out.append(MemoryPoint(pred, measured_bytes=comparable_peak_bytes(
                row.peak_memory_bytes, device), zero_stage=stage))
    return out


def _two_studies(earlier: Sequence[MemoryPoint], own: Sequence[MemoryPoint],
                 prior: tuple[float, float], noise_sd: float) -> LogCorrection:
    """``earlier`` fitted from ``prior``, carried over, then ``own`` from that; the
    counts are both's."""
    e = fit_memory(earlier, prior_mean=prior[0], prior_sd=prior[1], noise_sd=noise_sd)
    m0, s0 = carry_over(e, prior[1], fresh_mean=prior[0])
    o = fit_memory(own, prior_mean=m0, prior_sd=s0, noise_sd=noise_sd)
    return LogCorrection(o.mean, o.sd, o.n_ok + e.n_ok, o.n_censored + e.n_censored)


def _by_stage(earlier: Sequence[MemoryPoint], own: Sequence[MemoryPoint],
              stages: Iterable[int], memory_sd: float) -> tuple[tuple[int, LogCorrection], ...]:
    """Each stage's correction: the other stages' carried over, then its own points."""
    fresh = (0.0, memory_sd)
    out = []
    for z in sorted(set(stages) | {p.zero_stage for p in (*earlier, *own)}):
        others = _two_studies([p for p in earlier if p.zero_stage != z],
                              [p for p in own if p.zero_stage != z], fresh, memory_sd)
        prior = carry_over(others, memory_sd, rho=STAGE_CORRELATION)
        out.append((z, _two_studies([p for p in earlier if p.zero_stage == z],
                                    [p for p in own if p.zero_stage == z], prior, memory_sd)))
    return tuple(out)


def _throughput_ratios(rows: Iterable[MeasuredRow]) -> list[float]:
    return [math.log(r.measured_tflops / r.predicted_tflops) for r in rows
            if not r.oom and r.measured_tflops and r.predicted_tflops
            and r.measured_tflops > 0 and r.predicted_tflops > 0]


def _residuals(rows: Sequence[MeasuredRow]) -> tuple[Residual, ...]:
    by_study: dict[str, list[MeasuredRow]] = {}
    for r in rows:
        if (not r.oom and r.measured_tflops and r.predicted_tflops and r.measured_tflops > 0
                and r.predicted_tflops > 0):
            by_study.setdefault(r.study, []).append(r)
    out = []
    for study_rows in by_study.values():
        logs = [math.log(r.predicted_tflops) for r in study_rows]  # type: ignore[arg-type]
        centre = sum(logs) / len(logs)
        out += [Residual(r.layout, math.log(r.measured_tflops / r.predicted_tflops),  # type: ignore[operator]
                         lp - centre) for r, lp in zip(study_rows, logs, strict=True)]
    return tuple(out)


def calibrate(key: CalibrationKey, earlier: Sequence[MeasuredRow],
              own: Sequence[MeasuredRow] = (), *, memory_sd: float,
              usable_bytes: float | None, zero_stages: Iterable[int] = ()) -> Calibration:
    """Both corrections of a study of ``key``: ``earlier`` (other studies' rows of the key)
    fitted from the fresh priors and carried over (:func:`carry_over`), then ``own`` (the
    study's rows) fitted from that prior; the memory correction per ZeRO stage too (of
    ``zero_stages``, the study's, and of every stage measured).

    ``memory_sd``: the memory model's typical stated log-sd for the study's layouts (prior
    width and per-layout scatter of the memory correction). ``usable_bytes``: the study's
    usable device memory, the bound an OOM exceeded (for earlier studies' OOMs too: one
    device type has one memory); ``None`` (no memory rule) leaves OOMs out.
    """
    device = key.device_type
    mem_earlier = _memory_points(earlier, usable_bytes, device)
    mem_own = _memory_points(own, usable_bytes, device)
    memory = _two_studies(mem_earlier, mem_own, (0.0, memory_sd), memory_sd)
    by_stage = _by_stage(mem_earlier, mem_own, zero_stages, memory_sd)
    tp_earlier = fit_throughput(_throughput_ratios(earlier), prior_sd=scale_sd(device))
    t0, ts = carry_over(tp_earlier, scale_sd(device))  # the search's prior on the device
    tp_own = fit_throughput(_throughput_ratios(own), prior_mean=t0, prior_sd=ts)
    throughput = LogCorrection(tp_own.mean, tp_own.sd, tp_own.n_ok + tp_earlier.n_ok)
    counts = Counter(row.study for row in earlier)  # in the order of the rows
    runs = tuple((r.layout, float(r.measured_tflops)) for r in own
                 if not r.oom and r.measured_tflops and r.measured_tflops > 0)
    return Calibration(key, memory=memory, memory_by_stage=by_stage, throughput=throughput,
                       learned_from=tuple(counts.items()), own=len(own),
                       residuals=_residuals(earlier), runs=runs)
