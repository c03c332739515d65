"""One layer's time, measured or analytic: the blend of the study's layer profile
(:mod:`autotune.models.profile`) with the analytic terms of :mod:`autotune.models.compute`
and :mod:`autotune.models.communication`. Where the profile has the layer's shape its
measurement is used as is (vTrain's method at layer granularity); where it measured other
shapes only, the analytic time is scaled by :func:`profile_scale` so that measured and
unmeasured layouts compete on one level.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.models.communication import tp_allreduce_time_s
from autotune.models.compute import (
    flash_backward_extra_s,
    host_exposed_time_s,
    host_layer_time_s,
    layer_forward_time_s,
    recompute_time_s,
)
from autotune.models.links import tp_link
from autotune.models.profile import LayerProfile, LayerShape

__all__ = ["LayerTime", "analytic_layer", "calibrate", "layer_terms", "profile_scale"]


@dataclass(frozen=True)
class LayerTime:
    """One transformer layer for one micro-batch on one TP rank: forward, backward and
    (with full recompute) the recompute forward, in seconds."""

    compute_s: float
    """Device compute (measured: the whole measured layer time)."""
    tp_comm_s: float
    """TP all-reduces, on the device stream, not overlapped (0 when measured)."""
    host_s: float
    """Host dispatch time the device did not hide (0 when measured)."""
    measured: bool = False
    """From the layer profile rather than the analytic model."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.host_s


def layer_terms(model: ModelConfig, layout: Layout, cluster: ClusterConfig,
                dtype: str = "bf16", *, profile: LayerProfile | None = None) -> LayerTime:
    """The layer time the step is composed of: measured where ``profile`` (the study's
    ``cluster.profile``, :func:`autotune.models.profile.load_cluster_profile`) has the
    layer's shape (:mod:`autotune.models.profile`), else analytic.

    Analytic: the forward (:func:`layer_forward_time_s`) counted 3 times (backward = 2
    forwards; Narayanan et al. 2021, section 3.5) or 4 with recompute, a fused attention
    kernel's backward at 2.5 of its forwards (:func:`flash_backward_extra_s`), the TP
    all-reduces (:func:`tp_allreduce_time_s`) and the host time not hidden
    (:func:`host_exposed_time_s`), the device running asynchronously behind the host.

    With a profile that measured other shapes of this layer but not this one, the
    analytic compute and host time are scaled by :func:`profile_scale`, so that measured
    and unmeasured layouts compete on one level (an analytic model 10% optimistic would
    otherwise favour every shape the profile left out).
    """
    if profile is not None:
        measured = profile.layer_time_s(LayerShape.of(
            model, layout, device=cluster.device, dtype=dtype, tp_link=tp_link(layout, cluster)))
        if measured is not None:
            # vTrain's method at layer granularity: the measurement already holds the
            # shape-specific kernel speed, the all-reduces and the host time not hidden.
            return LayerTime(measured, 0.0, 0.0, measured=True)
        # The scale is the stack's speed on this device (kernels, host), measured inside a
        # node: it scales compute and host time, not an all-reduce over another link.
        k = profile_scale(model, cluster, dtype, profile)
        t = analytic_layer(model, layout, cluster, dtype)
        return LayerTime(k * t.compute_s, t.tp_comm_s, k * t.host_s)
    return analytic_layer(model, layout, cluster, dtype)


def analytic_layer(model: ModelConfig, layout: Layout, cluster: ClusterConfig,
                   dtype: str = "bf16") -> LayerTime:
    """The analytic :class:`LayerTime` (see :func:`layer_terms`), whatever the profile."""
    spec = cluster.device_spec()
    peak = spec.peak_flops_or_fallback(dtype)
    compute = (3.0 * layer_forward_time_s(model, layout, peak, spec, dtype)
               + flash_backward_extra_s(model, layout, peak, spec, dtype)
               + recompute_time_s(model, layout, peak, spec, dtype))
    tp_comm = tp_allreduce_time_s(model, layout, spec, tp_link(layout, cluster), dtype,
                                  cluster=cluster)
    host = host_exposed_time_s(compute + tp_comm, host_layer_time_s(layout, spec))
    return LayerTime(compute, tp_comm, host)


@functools.lru_cache(maxsize=256)
def profile_scale(model: ModelConfig, cluster: ClusterConfig, dtype: str,
                  profile: LayerProfile | None) -> float:
    """How much slower than the analytic model this stack computes and dispatches a layer:
    over the shapes of ``model``'s layer that ``profile`` measured on ``cluster``'s device
    and dtype, the :func:`calibrate` scale (a geometric mean) of the analytic compute plus
    host time against the measured time less the analytic TP all-reduces; 1 when it
    measured none. Memoised: every layout of a study asks."""
    if profile is None:
        return 1.0
    measured, analytic = [], []
    for entry in profile.entries:
        sh = entry.shape
        lay = Layout(sh.tp, 1, 1, sh.micro_batch, 1, recompute=sh.recompute,
                     sequence_parallel=sh.sequence_parallel)
        if LayerShape.of(model, lay, device=cluster.device, dtype=dtype,
                         tp_link=tp_link(lay, cluster)) != sh:
            continue  # another layer, device, dtype, or TP over another link
        t = analytic_layer(model, lay, cluster, dtype)
        measured.append(entry.layer_time_s - t.tp_comm_s)
        analytic.append(t.compute_s + t.host_s)
    return calibrate(analytic, measured)


def calibrate(predicted_s: list[float], measured_s: list[float]) -> float:
    """The scale ``k`` minimising the squared log error of ``k * predicted`` vs measured.

    The hook for measurements: multiplying every prediction by one factor keeps the
    ranking and fixes the absolute level (the geometric mean of measured/predicted).
    """
    pairs = [(p, m) for p, m in zip(predicted_s, measured_s, strict=True) if p > 0 and m > 0]
    if not pairs:
        return 1.0
    return math.exp(sum(math.log(m / p) for p, m in pairs) / len(pairs))
