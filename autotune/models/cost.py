"""Analytic step time of a layout: compute, communication, pipeline bubble, optimizer.

One optimizer step of 1F1B pipelining with ``m = grad_accum`` micro-batches over ``p``
stages takes (Narayanan et al. 2021, section 2.2.1; unequal stages generalised)::

    T = (m - 1) * max_i t_i + sum_i t_i  +  T_dp  +  T_opt

where ``t_i`` is stage ``i``'s time for one micro-batch (forward, backward, recompute, its
TP all-reduces, its point-to-point sends): with equal stages this is the textbook
``(m + p - 1) t``, i.e. a bubble fraction ``(p - 1) / m``. ``T_dp`` is the exposed part
of the data-parallel gradient reduction and ``T_opt`` the memory-bound optimizer step.

Every term is one function below, citing its source; what crosses nodes (where a group's
ranks sit, their share of the node's NICs, NCCL's ring or tree) is
:mod:`autotune.models.network`. Constants are physical (datasheet
peaks, published GEMM efficiencies, launch latencies: the device's entry in
:data:`autotune.hardware.HARDWARE`), never fitted to a landscape; the hooks for
measurements are :func:`calibrate`, a single scale factor that leaves the ranking alone,
and a measured :class:`~autotune.models.profile.LayerProfile` passed as ``profile``. See
``docs/models.md``.

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

import functools
import math
from dataclasses import dataclass

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.hardware import DeviceSpec, LinkSpec
from autotune.layout import Layout
from autotune.models.flops import (
    hardware_flops_per_step,
    model_flops_per_step,
    recompute_forward_fraction,
    tflops_per_device,
)
from autotune.models.memory import dtype_bytes, params_per_rank
from autotune.models.network import (
    GroupPlacement,
    allreduce_time_s,
    dp_group_placements,
    network_link,
    p2p_message_time_s,
    pipeline_placement,
    ring_allreduce_time_s,
    tp_group_placements,
)
from autotune.models.profile import LayerProfile, LayerShape

__all__ = [
    "StepEstimate",
    "estimate_step",
    "gemm_efficiency",
    "gemm_time_s",
    "layer_forward_time_s",
    "attention_core_time_s",
    "recompute_time_s",
    "tp_collectives_per_layer",
    "tp_allreduce_equivalents",
    "logits_forward_time_s",
    "ring_allreduce_time_s",
    "group_allreduce_time_s",
    "tp_allreduce_time_s",
    "p2p_time_s",
    "stage_p2p_times_s",
    "dp_reduce_time_s",
    "dp_overlaps_backward",
    "dp_exposed_time_s",
    "zero3_gather_time_s",
    "optimizer_time_s",
    "pipeline_time_s",
    "LayerTime",
    "layer_terms",
    "analytic_layer",
    "profile_scale",
    "host_layer_time_s",
    "host_exposed_time_s",
    "link_level",
    "tp_link",
    "calibrate",
]


GEMM_RAMP_S = 5e-6
"""A GEMM reaches ``gemm_efficiency_max`` only when its ideal time is long against the
launch, the fill of the first wave and the tail of the last (a few microseconds)."""

DP_OVERLAP_STAGES = (3,)
"""ZeRO stages for which DeepSpeed turns ``overlap_comm`` on by default: only stage 3
(deepspeedai/DeepSpeed ``deepspeed/runtime/zero/config.py`` @cbf3d661,
``overlap_comm_valid``: ``self.overlap_comm = self.stage == ZeroStageEnum.weights``), whose
traffic :func:`zero3_gather_time_s` prices. Before: ``(2, 3)``, which hid ZeRO-2's
reduction behind the backward although the trainer's config (``autotune/dsconfig.py``)
leaves ``overlap_comm`` at that default. See :func:`dp_overlaps_backward`."""


def link_level(span: int, cluster: ClusterConfig, devices_per_card: int) -> str:
    """Which link a group of ``span`` consecutive ranks crosses.

    TP groups are consecutive ranks, a DP group spans ``tp * dp`` ranks and a pipeline
    spans the world (rank order of :mod:`autotune.layout`): a group that fits one card
    talks over the card's tile link, one that fits a node over the node's fabric, any
    larger one over the network, priced by :mod:`autotune.models.network` (where its ranks
    sit, how many NICs they use, the ring or tree NCCL picks).
    """
    if span <= 1:
        return "none"
    if span <= devices_per_card:
        return "intra_card"
    if span <= cluster.devices_per_node:
        return "intra_node"
    return "inter_node"


def tp_link(layout: Layout, cluster: ClusterConfig) -> str:
    """The link ``layout``'s TP groups cross on ``cluster`` (:func:`link_level`); the
    network also when a group of ``tp <= devices_per_node`` straddles two nodes (``tp``
    not dividing ``devices_per_node``: tp = 8 on 12-tile Aurora nodes)."""
    level = link_level(layout.tp, cluster, cluster.device_spec().devices_per_card)
    if level != "inter_node" and layout.tp > 1 and any(
            g.crosses_nodes for g in tp_group_placements(
                layout.tp, layout.world_size, cluster.devices_per_node)):
        return "inter_node"
    return level


def _intra_link(spec: DeviceSpec, cluster: ClusterConfig, span: int) -> LinkSpec:
    """The link inside a node between ranks at most ``span`` consecutive ranks apart."""
    level = link_level(max(2, min(span, cluster.devices_per_node)), cluster,
                       spec.devices_per_card)
    return _link(spec, level)


def _node_ranks(layout: Layout, cluster: ClusterConfig) -> int:
    """Ranks of one node that take part in a collective every rank runs at once (the TP
    all-reduces of every group; the DP reduction of every stage and TP rank)."""
    return min(cluster.devices_per_node, layout.world_size)


def group_allreduce_time_s(n_bytes: float, groups: tuple[GroupPlacement, ...], span: int,
                           layout: Layout, cluster: ClusterConfig) -> float:
    """One all-reduce of ``n_bytes`` in every group of a kind at once (all TP groups, or
    all DP groups), timed by the slowest group's placement: inside a node the ring over
    the link its ``span`` consecutive ranks cross; across nodes
    :func:`autotune.models.network.allreduce_time_s` (ring or tree, each rank at its
    share of the node's NICs with every rank of the node in a group)."""
    spec = cluster.device_spec()
    intra = _intra_link(spec, cluster, span)
    network = cluster.network()
    return max(allreduce_time_s(n_bytes, g, intra, network, _node_ranks(layout, cluster))
               for g in groups)


def _link(spec: DeviceSpec, level: str) -> LinkSpec:
    return getattr(spec, level)


def gemm_efficiency(flops: float, peak_flops: float, spec: DeviceSpec) -> float:
    """Fraction of peak one GEMM of ``flops`` reaches: rising with the work per kernel.

    ``e(w) = e_max * w / (w + w_half)`` with ``w_half = peak * e_max * GEMM_RAMP_S``: the
    same as a kernel that runs at ``e_max`` after a fixed ramp of ``GEMM_RAMP_S``. Small
    GEMMs (small micro-batch, sequence or hidden / tp) cannot fill the device's compute
    units (wave quantization; NVIDIA, "Matrix Multiplication Background User's Guide").
    """
    w_half = peak_flops * spec.gemm_efficiency_max * GEMM_RAMP_S
    return spec.gemm_efficiency_max * flops / (flops + w_half)


def gemm_time_s(flops: float, peak_flops: float, spec: DeviceSpec) -> float:
    """Time of one GEMM: ``flops / (peak * gemm_efficiency(flops))``."""
    if flops <= 0:
        return 0.0
    return flops / (peak_flops * gemm_efficiency(flops, peak_flops, spec))


def layer_forward_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                         spec: DeviceSpec, dtype: str) -> float:
    """Forward time of one transformer layer for one micro-batch on one TP rank.

    GEMMs (per token: QKV ``2h(h+2kv)/t``, projection ``2h^2/t``, MLP ``2hf/t`` per
    matrix: up and down for GELU, gate, up and down for SwiGLU: :mod:`autotune.models.flops`),
    each timed with :func:`gemm_efficiency`; the attention core
    (:func:`attention_core_time_s`); plus the memory-bound element-wise kernels
    (LayerNorm, bias+dropout+residual: ``11`` tensors of ``s b h``, ``s b h / t`` each with
    sequence parallelism, which runs them on a sequence shard (Korthikanti et al. 2022,
    section 4.2.2); bias+GeLU reads and writes ``f/t`` per token, ``8/t`` of ``s b h`` at
    ``f = 4h``; SwiGLU's SiLU reads and writes ``f/t``, its product reads ``2f/t`` and
    writes ``f/t``: one more kernel).
    """
    b, s, h, f, t = layout.micro_batch, model.seq_len, model.hidden, model.ffn, layout.tp
    kv = model.kv_heads * model.head_dim
    tokens = b * s
    mlp = [2 * tokens * h * f / t] * model.mlp_matrices
    gemms = [2 * tokens * h * (h + 2 * kv) / t, 2 * tokens * h * h / t, *mlp]
    time = sum(gemm_time_s(w, peak_flops, spec) for w in gemms)
    swiglu = model.mlp == "swiglu"
    mlp_elem = (5 if swiglu else 2) * f / t  # per token: elements read + written
    replicated = 11 * h / t if layout.sequence_parallel else 11 * h
    elem_bytes = tokens * (replicated + mlp_elem) * dtype_bytes(dtype)
    n_elementwise = 7 if swiglu else 6
    time += elem_bytes / (spec.hbm_gbps * 1e9) + n_elementwise * spec.kernel_overhead_s
    return time + attention_core_time_s(model, layout, peak_flops, spec, dtype)


def attention_core_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                          spec: DeviceSpec, dtype: str) -> float:
    """Forward time of the attention core, ``softmax(Q K^T) V``, for one micro-batch on
    one TP rank: what selective recompute repeats in the backward (Korthikanti et al.
    2022, section 5). The two attention matmuls ``2*2 s^2 h / t`` (one fused kernel with
    flash attention) and, with ``model.attention == "explicit"``, the score matrix
    written, soft-maxed and dropped out (~5 passes over ``a s^2 b / t`` elements; 3
    without dropout)."""
    b, s, h, t = layout.micro_batch, model.seq_len, model.hidden, layout.tp
    attn = 4 * b * s * s * h / t
    if model.attention == "flash":
        return gemm_time_s(attn, peak_flops, spec)
    time = 2 * gemm_time_s(attn / 2, peak_flops, spec)
    # scores written, soft-maxed (read, write); dropout reads them, writes output + mask
    passes = 5 if model.dropout > 0 else 3
    elem_bytes = passes * model.n_head * s * s * b / t * dtype_bytes(dtype)
    n_elementwise = 2 if model.dropout > 0 else 1
    return time + elem_bytes / (spec.hbm_gbps * 1e9) + n_elementwise * spec.kernel_overhead_s


def recompute_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                     spec: DeviceSpec, dtype: str) -> float:
    """What the layout's recompute adds to one layer and micro-batch: a whole layer
    forward with ``full`` (Chen et al. 2016), the attention core with ``selective``
    (:func:`attention_core_time_s`), nothing with ``none``."""
    if layout.recompute == "full":
        return layer_forward_time_s(model, layout, peak_flops, spec, dtype)
    if layout.recompute == "selective":
        return attention_core_time_s(model, layout, peak_flops, spec, dtype)
    return 0.0


HOST_OPS_PER_LAYER_PASS = 50
"""Framework operators the host dispatches per transformer layer and pass (LayerNorms,
linears, views and transposes, softmax, dropout, bias-adds, TP region copies)."""
HOST_SERIAL_FRACTION = 0.25
"""Share of the shorter of host and device time that does not overlap when the two are
balanced (see :func:`host_exposed_time_s`): a quarter, i.e. mostly asynchronous."""


def host_layer_time_s(layout: Layout, spec: DeviceSpec) -> float:
    """Host (Python + dispatcher) time of one layer for one micro-batch, all passes.

    Eager PyTorch spends ~10-20 us of CPU per operator (He, "Making Deep Learning Go
    Brrrr From First Principles", 2022: overhead-bound regime); the device runs
    asynchronously, so a layer takes at least this long however small its kernels.
    Each TP collective adds one more synchronising call.
    """
    passes = 4 if layout.recompute == "full" else 3
    ops = passes * HOST_OPS_PER_LAYER_PASS
    if layout.recompute == "selective":
        ops += SELECTIVE_RECOMPUTE_OPS
    if layout.tp > 1:
        ops += tp_collectives_per_layer(layout)
    return ops * spec.host_op_s


SELECTIVE_RECOMPUTE_OPS = 8
"""Operators of the attention core recomputed under selective recompute (views, two
matmuls, scale, mask, softmax; the checkpoint's own bookkeeping)."""


def tp_collectives_per_layer(layout: Layout) -> int:
    """TP collective calls of one layer and micro-batch: 4 all-reduces (2 forward, 2
    backward; Shoeybi et al. 2019, fig. 4), 2 more with the full recompute forward. With
    sequence parallelism each becomes an all-gather or a reduce-scatter, and the backward
    gathers the two column-parallel linears' inputs again (they are stored as sequence
    shards; Korthikanti et al. 2022, section 4.2.2): 2 more."""
    count = 6 if layout.recompute == "full" else 4
    return count + (2 if layout.sequence_parallel else 0)


def host_exposed_time_s(device_s: float, host_s: float, *,
                        serial_fraction: float = HOST_SERIAL_FRACTION) -> float:
    """Host time not hidden behind the device for one layer and micro-batch.

    The host enqueues kernels ahead of the device (CUDA streams are asynchronous), so
    host and device form a two-stage tandem: when one side is much slower it sets the
    pace and the other is hidden entirely, ``max(device, host)``; this is the
    overhead-bound regime of He (2022), where the time per micro-batch does not depend on
    the kernels' size (vTrain: tp = 4, h = 2048 takes the same time per micro-batch at
    micro-batch 1 and 2). Overlap is lost when neither side dominates: the per-operator
    costs alternate (a long GEMM, then a run of short element-wise kernels, a collective),
    so each side is in turn the bottleneck and the other waits. The exposed part is
    charged as ``serial_fraction * min * (min / max)``: ``HOST_SERIAL_FRACTION`` of the
    shorter side when the two are equal, vanishing as one side dominates. (Before: a
    constant quarter of the shorter side, which charged up to a quarter of the device time
    to overhead-bound layouts whose device work is fully hidden.) Returns the time beyond
    ``device_s``.
    """
    longer, shorter = max(device_s, host_s), min(device_s, host_s)
    if longer <= 0:
        return 0.0
    layer = longer + serial_fraction * shorter * (shorter / longer)
    return layer - device_s


def logits_forward_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                          spec: DeviceSpec) -> float:
    """Forward time of the vocabulary-parallel output layer and the fp32 softmax/loss
    (``2 b s h V / t`` FLOPs; the logits read and written in fp32 about 3 times)."""
    b, s, t = layout.micro_batch, model.seq_len, layout.tp
    vocab = math.ceil(model.vocab_size / t)
    gemm = gemm_time_s(2 * b * s * model.hidden * vocab, peak_flops, spec)
    return gemm + 3 * b * s * vocab * 4 / (spec.hbm_gbps * 1e9) + 4 * spec.kernel_overhead_s


def tp_allreduce_time_s(model: ModelConfig, layout: Layout, spec: DeviceSpec,
                        level: str, dtype: str, *, cluster: ClusterConfig | None = None) -> float:
    """TP communication of one layer and one micro-batch (forward, backward, recompute).

    Megatron TP (Shoeybi et al. 2019, fig. 4) all-reduces the ``s b h`` output of the
    attention and of the MLP block in the forward pass and their input gradients in the
    backward: 4 all-reduces per layer, 6 with the recompute forward. Not overlapped.
    Each is a ring over ``level``'s link; a TP group across nodes (``level`` the network,
    with ``cluster``) is timed as the network's all-reduce (:func:`group_allreduce_time_s`:
    ring or hierarchical tree, every rank of the node in a TP group at once, sharing the
    node's NICs), Narayanan et al. 2021 (sec. 3.3) on why TP stays inside a node.
    """
    if layout.tp == 1:
        return 0.0
    n_bytes = model.seq_len * layout.micro_batch * model.hidden * dtype_bytes(dtype)
    return tp_allreduce_equivalents(layout) * _tp_one_allreduce_s(n_bytes, layout, spec,
                                                                  level, cluster)


def tp_allreduce_equivalents(layout: Layout) -> float:
    """TP traffic of one layer and micro-batch in all-reduces of ``s b h``: 4, 6 with full
    recompute (:func:`tp_allreduce_time_s`). Sequence parallelism replaces each all-reduce
    by an all-gather and a reduce-scatter of half its ring volume each, one of each where
    the all-reduce was (Korthikanti et al. 2022, section 4.2.2: "the same communication
    volume"), and adds the backward's re-gather of the two stored input shards: one
    all-reduce's worth more. Megatron issues that re-gather asynchronously beside the
    input-gradient GEMM (``LinearWithGradAccumulationAndAsyncCommunication.backward``,
    deepspeedai/Megatron-DeepSpeed@4efb479 ``megatron/core/tensor_parallel/layers.py``);
    the trainer does not, so it is charged, as the all-reduces are (not overlapped)."""
    count = 6.0 if layout.recompute == "full" else 4.0
    return count + (1.0 if layout.sequence_parallel else 0.0)


def _tp_one_allreduce_s(n_bytes: float, layout: Layout, spec: DeviceSpec, level: str,
                        cluster: ClusterConfig | None) -> float:
    if layout.tp == 1:
        return 0.0
    if level == "inter_node" and cluster is not None:
        groups = tp_group_placements(layout.tp, layout.world_size, cluster.devices_per_node)
        return group_allreduce_time_s(n_bytes, groups, layout.tp, layout, cluster)
    return ring_allreduce_time_s(n_bytes, layout.tp, _link(spec, level))


def p2p_time_s(model: ModelConfig, layout: Layout, link: LinkSpec, dtype: str, *,
               gather_s: float = 0.0) -> float:
    """Point-to-point traffic of one stage for one micro-batch over ``link``: the ``s b h``
    activation sent forward and its gradient sent back (Narayanan et al. 2021, sec. 4.1),
    each split over the ``t`` TP ranks and all-gathered on arrival in ``gather_s``
    (:func:`autotune.models.network.p2p_message_time_s`: Megatron's scatter/gather, and
    DeepSpeed's ``pipe_partitioned``, both on by default)."""
    if layout.pp == 1:
        return 0.0
    n_bytes = model.seq_len * layout.micro_batch * model.hidden * dtype_bytes(dtype)
    return 2 * p2p_message_time_s(n_bytes, layout.tp, link, gather_s)


def stage_p2p_times_s(model: ModelConfig, layout: Layout, cluster: ClusterConfig,
                      dtype: str) -> list[float]:
    """Per stage, the point-to-point time of one micro-batch (:func:`p2p_time_s`) over the
    slower of its two boundaries.

    A boundary between stages on one node runs over the card or node link; one that
    crosses nodes (:func:`autotune.models.network.pipeline_placement`: stage blocks of
    ``tp dp >= devices_per_node`` ranks, or a node boundary inside the pair) over the
    network, each sending rank at its share of the NICs with all of its node's senders
    at once (in 1F1B's steady state every stage exchanges in the same slot). The
    receivers' all-gather of the split activation is half a TP all-reduce. The stage
    next to the slowest boundary is the slowest stage, which sets 1F1B's steady state
    (:func:`pipeline_time_s`).
    """
    p = layout.pp
    if p == 1:
        return [0.0]
    spec = cluster.device_spec()
    place = pipeline_placement(layout.tp, layout.dp, p, cluster.devices_per_node,
                               spec.devices_per_card)
    n_bytes = model.seq_len * layout.micro_batch * model.hidden * dtype_bytes(dtype)
    gather = 0.5 * _tp_one_allreduce_s(n_bytes, layout, spec, tp_link(layout, cluster),
                                       cluster)
    network = network_link(place.senders_per_node, cluster.network())
    per_boundary = []
    for crosses, card in zip(place.crosses_nodes, place.within_card, strict=True):
        link = network if crosses else spec.intra_card if card else spec.intra_node
        per_boundary.append(p2p_time_s(model, layout, link, dtype, gather_s=gather))
    return [max(per_boundary[max(0, s - 1)], per_boundary[min(s, p - 2)]) for s in range(p)]


def dp_reduce_time_s(n_params: int, layout: Layout, cluster: ClusterConfig,
                     dtype: str) -> float:
    """Data-parallel gradient reduction per step: an all-reduce of the stage's gradients
    (ZeRO-1/2: a reduce-scatter plus the all-gather of the updated weights, the same
    volume; Rajbhandari et al. 2020, section 7) in every DP group at once, timed by the
    slowest group (:func:`group_allreduce_time_s`): a ring over the card or node link
    inside a node; across nodes the ring or the hierarchical tree with every rank of the
    node reducing at once and sharing its NICs (all TP ranks' groups, and with a pipeline
    all stages': DeepSpeed's pipeline engine reduces after the last micro-batch on every
    stage, :func:`dp_overlaps_backward`)."""
    if layout.dp == 1:
        return 0.0
    groups = dp_group_placements(layout.tp, layout.dp, layout.pp, cluster.devices_per_node)
    return group_allreduce_time_s(n_params * dtype_bytes(dtype), groups,
                                  layout.tp * layout.dp, layout, cluster)


def dp_overlaps_backward(layout: Layout, *, overlap_comm: bool | None = None) -> bool:
    """Whether the gradient reduction runs beside the last micro-batch's backward, as the
    trainer's engine (DeepSpeed) schedules it.

    With a pipeline, never: DeepSpeed's ``TrainSchedule`` issues ``ReduceGrads`` in the
    last step of the batch, after the flush, on every stage (deepspeedai/DeepSpeed
    ``deepspeed/runtime/pipe/schedule.py`` @83fd8f87; ``engine.py`` ``_exec_reduce_grads``
    @03f6f75c, which calls ``allreduce_gradients`` with the engine's own backward
    all-reduce switched off). Without one, only with ``overlap_comm`` (ZeRO's bucketed
    reduction on a side stream during the backward), which DeepSpeed turns on by default
    for ZeRO-3 alone (:data:`DP_OVERLAP_STAGES`); ZeRO-0 all-reduces after the backward,
    and ZeRO-1/2 without ``overlap_comm`` reduce on the compute stream.

    Megatron-LM, for comparison: ``--overlap-grad-reduce`` is off by default
    (``megatron/core/distributed/distributed_data_parallel_config.py``,
    ``overlap_grad_reduce: bool = False``); on, the non-pipelined schedule reduces buckets
    during the last micro-batch's backward, and the pipelined 1F1B schedule enables grad
    sync for the last micro-batch only (``megatron/core/pipeline_parallel/schedules.py``
    @00611e6e, ``forward_backward_pipelining_without_interleaving``): in both the window
    is that one micro-batch's backward (:func:`dp_exposed_time_s`).
    """
    if layout.pp > 1 or layout.dp == 1:
        return False
    on = layout.zero_stage in DP_OVERLAP_STAGES if overlap_comm is None else overlap_comm
    return on


def dp_exposed_time_s(dp_s: float, window_s: float, overlapped: bool) -> float:
    """The part of the gradient reduction ``dp_s`` the step waits for: all of it, or what
    the last micro-batch's backward (``window_s``: its backward and recompute, during
    which buckets fill and are reduced) does not hide."""
    return max(0.0, dp_s - window_s) if overlapped else dp_s


def zero3_gather_time_s(n_params: int, layout: Layout, cluster: ClusterConfig,
                        dtype: str) -> float:
    """ZeRO-3 traffic of one micro-batch: all-gather the weights for the forward and again
    for the backward (and for the recompute forward), reduce-scatter the gradients; each
    moves ``(n-1)/n`` of the stage's 16-bit weights, half an all-reduce of them
    (:func:`dp_reduce_time_s`; Rajbhandari et al. 2020, section 7.2.2: 1.5x the
    data-parallel volume)."""
    if layout.zero_stage < 3 or layout.dp == 1:
        return 0.0
    passes = 4 if layout.recompute == "full" else 3
    return passes * 0.5 * dp_reduce_time_s(n_params, layout, cluster, dtype)


def optimizer_time_s(n_params: int, layout: Layout, spec: DeviceSpec, dtype: str) -> float:
    """Adam step over the rank's shard: memory-bound, ~28-30 bytes read or written per
    parameter (fp32 master, momentum, variance read and written; gradient read; 16-bit
    weight written). ZeRO-1 and above update only ``1/dp`` of the parameters."""
    shard = n_params / layout.dp if layout.zero_stage >= 1 else n_params
    per_param = 28 if dtype == "fp32" else 30
    return shard * per_param / (spec.hbm_gbps * 1e9)


def pipeline_time_s(stage_times_s: list[float], micro_batches: int) -> float:
    """1F1B step time of the pipeline: ``(m - 1) max t_i + sum t_i``.

    Narayanan et al. 2021, section 2.2.1: with equal stages ``(m + p - 1) t``, a bubble of
    ``(p - 1) / m`` of the ideal time; a slower stage (the last one with the logits)
    sets the steady-state rate.
    """
    return (micro_batches - 1) * max(stage_times_s) + sum(stage_times_s)


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
    forwards; Narayanan et al. 2021, section 3.5) or 4 with recompute, the TP
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
                  dtype: str = "bf16", profile: LayerProfile | None = None) -> StepEstimate:
    """Predicted step time and throughput of ``layout`` on ``cluster`` (pure function);
    with measured layer times where ``profile`` has them (:func:`layer_terms`)."""
    spec = cluster.device_spec()
    peak = spec.peak_flops_or_fallback(dtype)
    lay, m, p = layout, layout.grad_accum, layout.pp
    rc = recompute_forward_fraction(model, lay.recompute)
    layers = math.ceil(model.n_layer / p)

    layer = layer_terms(model, lay, cluster, dtype, profile=profile)
    layer_compute, tp_comm, exposed_host = layer.compute_s, layer.tp_comm_s, layer.host_s
    logits = 3.0 * logits_forward_time_s(model, lay, peak, spec)
    p2p = stage_p2p_times_s(model, lay, cluster, dtype)

    names = ["only"] if p == 1 else ["first", *["middle"] * (p - 2), "last"]
    gathers = {n: zero3_gather_time_s(params_per_rank(model, lay, n), lay, cluster, dtype)
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
    n_max = max(params_per_rank(model, lay, n) for n in set(names) - {"middle"})
    dp = 0.0
    if lay.dp > 1 and lay.zero_stage < 3:
        window = layers * layer_compute * (2.0 + rc) / (3.0 + rc)  # last backward + recompute
        dp = dp_exposed_time_s(dp_reduce_time_s(n_max, lay, cluster, dtype), window,
                               dp_overlaps_backward(lay))
    opt = optimizer_time_s(n_max, lay, spec, dtype)
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
    )


def calibrate(predicted_s: list[float], measured_s: list[float]) -> float:
    """The scale ``k`` minimising the squared log error of ``k * predicted`` vs measured.

    The hook for measurements: multiplying every prediction by one factor keeps the
    ranking and fixes the absolute level (the geometric mean of measured/predicted).
    """
    pairs = [(p, m) for p, m in zip(predicted_s, measured_s, strict=True) if p > 0 and m > 0]
    if not pairs:
        return 1.0
    return math.exp(sum(math.log(m / p) for p, m in pairs) / len(pairs))

