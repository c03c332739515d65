"""Analytic step time of a layout: compute, communication, pipeline bubble, optimizer.

One optimizer step of 1F1B pipelining with ``m = grad_accum`` micro-batches over ``p``
stages takes (Narayanan et al. 2021, section 2.2.1; unequal stages generalised)::

    T = (m - 1) * max_i t_i + sum_i t_i  +  T_dp  +  T_opt

where ``t_i`` is stage ``i``'s time for one micro-batch (forward, backward, recompute, its
TP all-reduces, its point-to-point sends): with equal stages this is the textbook
``(m + p - 1) t``, i.e. a bubble fraction ``(p - 1) / m``. ``T_dp`` is the exposed part
of the data-parallel gradient reduction and ``T_opt`` the memory-bound optimizer step.

Every term is one function citing its source, by concept: compute
(:mod:`autotune.models.compute`), communication (:mod:`autotune.models.communication`),
which link a group crosses (:mod:`autotune.models.links`), the wait for the slowest device
(:mod:`autotune.models.stragglers`) and the blend with a measured
layer profile (:mod:`autotune.models.profile_blend`); this module composes them. What
crosses nodes (where a group's ranks sit, their share of the node's NICs, NCCL's ring or
tree) is :mod:`autotune.models.network`. Constants are physical (datasheet peaks,
published GEMM efficiencies, launch latencies: the device's entry in
:data:`autotune.hardware.HARDWARE`), never fitted to a landscape; the hooks for
measurements are :func:`autotune.models.profile_blend.calibrate`, a single scale factor
that leaves the ranking alone, and a measured :class:`~autotune.models.profile.LayerProfile`
passed as ``profile``. See ``docs/models.md``.

>>> from autotune.config.cluster import ClusterConfig
>>> from autotune.config.model import MODEL_PRESETS
>>> from autotune.layout import Layout
>>> est = estimate_step(MODEL_PRESETS["gpt-1.3b"], Layout(tp=1, pp=1, dp=8, micro_batch=4,
...                     grad_accum=16, recompute="none"), ClusterConfig(devices_per_node=8,
...                     device="a100-80gb"), dtype="bf16")
>>> 100 < est.model_tflops_per_device < 250
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.models.communication import (
    dp_exposed_time_s,
    dp_overlaps_backward,
    dp_reduce_time_s,
    stage_p2p_times_s,
    tp_hidden_time_s,
    zero3_gather_time_s,
)
from autotune.models.compute import gemm_efficiency, logits_forward_time_s, optimizer_time_s
from autotune.models.flops import (
    hardware_flops_per_step,
    model_flops_per_step,
    recompute_forward_fraction,
    tflops_per_device,
)
from autotune.models.links import tp_link
from autotune.models.memory import params_per_rank
from autotune.models.profile import LayerProfile
from autotune.models.profile_blend import layer_terms
from autotune.models.stacks import (
    dp_reduce_bytes_per_param,
    hides_tp_backward,
    is_megatron,
    ties_embeddings,
)
from autotune.models.stragglers import straggler_factor
from autotune.models.ulysses import ulysses_layer_time_s, ulysses_share
from autotune.models.zero_variants import (
    replica_reduce_time_s,
    uses_own_zero_groups,
    zero3_traffic_time_s,
    zero_group_reduce_time_s,
)

__all__ = ["StepEstimate", "estimate_step", "pipeline_time_s"]


def pipeline_time_s(stage_times_s: list[float], micro_batches: int) -> float:
    """1F1B step time of the pipeline: ``(m - 1) max t_i + sum t_i``.

    Narayanan et al. 2021, section 2.2.1: with equal stages ``(m + p - 1) t``, a bubble of
    ``(p - 1) / m`` of the ideal time; a slower stage (the last one with the logits)
    sets the steady-state rate.
    """
    return (micro_batches - 1) * max(stage_times_s) + sum(stage_times_s)


@dataclass(frozen=True)
class StepEstimate:
    """Predicted time of one optimizer step and its breakdown, in seconds per step.

    The terms add up to ``step_time_s``; the first four are the slowest stage's, summed
    over the ``grad_accum`` micro-batches.
    """

    compute_s: float
    """Device compute: forward, backward, recompute, output layer and loss."""
    tp_comm_s: float
    """TP all-reduces."""
    host_s: float
    """Host dispatch time not hidden behind the device (small kernels: overhead-bound)."""
    pp_p2p_s: float
    """Point-to-point sends between stages."""
    bubble_s: float
    """Pipeline fill and drain beyond ``m`` times the slowest stage."""
    zero3_comm_s: float
    """ZeRO-3 gather/scatter not hidden behind compute."""
    dp_comm_s: float
    """Exposed data-parallel gradient reduction."""
    optimizer_s: float
    step_time_s: float
    model_tflops_per_device: float
    hardware_tflops_per_device: float
    gemm_efficiency: float
    """Efficiency of the layer's largest GEMM (a diagnostic)."""
    profiled: bool = False
    """The layer time is a measured one from the layer profile; ``compute_s`` then holds
    the whole measured layer time (its TP all-reduces and exposed host time included) and
    ``tp_comm_s`` and ``host_s`` are zero."""
    straggler_factor: float = 1.0
    """How much longer the device's kernels (``compute_s``, ``optimizer_s``) take than on
    the median device: the step waits for the slowest of its devices
    (:func:`autotune.models.stragglers.straggler_factor`)."""

    def to_dict(self) -> dict[str, float | bool]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Stage:
    compute: float
    tp_comm: float
    host: float
    p2p: float
    zero3: float

    @property
    def total(self) -> float:
        return self.compute + self.tp_comm + self.host + self.p2p + self.zero3


def estimate_step(model: ModelConfig, layout: Layout, cluster: ClusterConfig, *,
                  dtype: str = "bf16", profile: LayerProfile | None = None,
                  stack: str = "deepspeed") -> StepEstimate:
    """Predicted step time and throughput of ``layout`` on ``cluster`` (pure function);
    with measured layer times where ``profile`` has them (:func:`layer_terms`).
    ``stack`` (a resolved ``training.stack``): Megatron's column-parallel linears hide
    part of the TP traffic where the stack lets them
    (:func:`autotune.models.stacks.hides_tp_backward`); under Megatron's own optimizer the
    gradient reduction is its DDP's, over every data-parallel rank whatever the layout's
    ZeRO stage, after the backward, moving its fp32 gradient buffer
    (:func:`autotune.models.stacks.dp_reduce_bytes_per_param`). Megatron's GPT reduces and
    updates one embedding matrix where a rank holds both ends
    (:func:`autotune.models.stacks.ties_embeddings`)."""
    spec = cluster.device_spec()
    peak = spec.peak_flops_or_fallback(dtype)
    lay, m, p = layout, layout.grad_accum, layout.pp
    rc = recompute_forward_fraction(model, lay.recompute)
    layers = math.ceil(model.n_layer / p)

    layer = layer_terms(model, lay, cluster, dtype, profile=profile)
    # The step waits for its slowest device: every kernel's time is the median device's
    # times the expected slowdown of the slowest of the world's devices (models/stragglers).
    slowest = straggler_factor(lay.world_size, spec.speed_sd)
    # Ulysses: each rank computes s/u positions and adds its all-to-alls (models/ulysses).
    layer_compute = slowest * ulysses_share(layer.compute_s, lay)
    tp_comm = layer.tp_comm_s + ulysses_layer_time_s(model, lay, cluster, dtype)
    if not layer.measured and hides_tp_backward(stack, lay.sequence_parallel):
        # Megatron's column-parallel linears hide their backward collective behind their
        # own GEMMs (models/communication.tp_hidden_time_s); a measured layer is the
        # built-in trainer's, which does not.
        tp_comm -= tp_hidden_time_s(model, lay, spec, tp_link(lay, cluster), dtype,
                                    cluster=cluster)
    exposed_host = layer.host_s
    logits = slowest * 3.0 * ulysses_share(logits_forward_time_s(model, lay, peak, spec), lay)
    p2p = stage_p2p_times_s(model, lay, cluster, dtype)

    names = ["only"] if p == 1 else ["first", *["middle"] * (p - 2), "last"]
    zero3 = zero3_traffic_time_s if uses_own_zero_groups(lay) else zero3_gather_time_s
    tied = ties_embeddings(stack)
    gathers = {n: zero3(params_per_rank(model, lay, n, tied=tied), lay, cluster, dtype)
               for n in set(names) - {"middle"}}
    gathers["middle"] = gathers.get("first", 0.0)  # its layers; no embedding: conservative
    stages: list[_Stage] = []
    for i, name in enumerate(names):
        compute = layers * layer_compute + (logits if name in ("last", "only") else 0.0)
        # DeepSpeed prefetches the next layer's weights: gathers hide behind compute.
        stages.append(_Stage(compute, layers * tp_comm, layers * exposed_host, p2p[i],
                             max(0.0, gathers[name] - compute)))
    slow = max(stages, key=lambda st: st.total)
    pipe = pipeline_time_s([st.total for st in stages], m)

    # Data-parallel reduction and optimizer step of the largest shard.
    n_max = max(params_per_rank(model, lay, n, tied=tied) for n in set(names) - {"middle"})
    dp = 0.0
    if is_megatron(stack):
        # Megatron's DDP all-reduces (or, distributed, reduce-scatters) its buffer once
        # forward_backward has returned (train_step in megatron/training.py, without
        # --deepspeed; this Megatron has no --overlap-grad-reduce): nothing overlaps it.
        dp = dp_reduce_time_s(n_max, lay, cluster, dtype,
                              bytes_per_param=dp_reduce_bytes_per_param(dtype, stack))
    else:
        if lay.zero_group > 1 and lay.zero_stage < 3:
            window = layers * layer_compute * (2.0 + rc) / (3.0 + rc)  # last bwd + recompute
            reduce = zero_group_reduce_time_s if uses_own_zero_groups(lay) else \
                dp_reduce_time_s
            dp = dp_exposed_time_s(reduce(n_max, lay, cluster, dtype), window,
                                   dp_overlaps_backward(lay))
        dp += replica_reduce_time_s(n_max, lay, cluster, dtype)  # MiCS's second hop
    opt = slowest * optimizer_time_s(n_max, lay, spec, dtype)
    step = pipe + dp + opt

    world = lay.world_size
    model_flops = model_flops_per_step(model, lay.global_batch)
    hw_flops = hardware_flops_per_step(model, lay.global_batch, recompute=lay.recompute)
    big = 2 * lay.micro_batch * model.seq_len * model.hidden * model.ffn / lay.tp
    return StepEstimate(
        compute_s=m * slow.compute,
        tp_comm_s=m * slow.tp_comm,
        host_s=m * slow.host,
        pp_p2p_s=m * slow.p2p,
        bubble_s=pipe - m * slow.total,
        zero3_comm_s=m * slow.zero3,
        dp_comm_s=dp,
        optimizer_s=opt,
        step_time_s=step,
        model_tflops_per_device=tflops_per_device(model_flops, step, world),
        hardware_tflops_per_device=tflops_per_device(hw_flops, step, world),
        gemm_efficiency=gemm_efficiency(big, peak, spec),
        profiled=layer.measured,
        straggler_factor=slowest,
    )
