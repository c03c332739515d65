"""Communication of one step: TP all-reduces (or SP's gathers and scatters), pipeline
point-to-point sends, the data-parallel gradient reduction and what of it the backward
hides, and ZeRO-3's weight gathers. Part of the analytic step time of
:mod:`autotune.models.cost`; which link each crosses is :mod:`autotune.models.links`.
"""

from __future__ import annotations

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.hardware import DeviceSpec, LinkSpec
from autotune.layout import Layout
from autotune.models.compute import shaped_gemm_time_s
from autotune.models.links import group_allreduce_time_s, link_spec, tp_link
from autotune.models.memory import dtype_bytes
from autotune.models.network import (
    dp_group_placements,
    network_link,
    p2p_message_time_s,
    pipeline_placement,
    ring_allreduce_time_s,
    tp_group_placements,
)

__all__ = [
    "DP_OVERLAP_STAGES",
    "dp_exposed_time_s",
    "dp_overlaps_backward",
    "dp_reduce_time_s",
    "p2p_time_s",
    "sbh_bytes",
    "stage_p2p_times_s",
    "tp_allreduce_equivalents",
    "tp_allreduce_time_s",
    "tp_hidden_time_s",
    "zero3_gather_time_s",
]


DP_OVERLAP_STAGES = (3,)
"""ZeRO stages for which DeepSpeed turns ``overlap_comm`` on by default: only stage 3
(deepspeedai/DeepSpeed ``deepspeed/runtime/zero/config.py`` @cbf3d661,
``overlap_comm_valid``: ``self.overlap_comm = self.stage == ZeroStageEnum.weights``), whose
traffic :func:`zero3_gather_time_s` prices. Before: ``(2, 3)``, which hid ZeRO-2's
reduction behind the backward although the trainer's config (``autotune/dsconfig.py``)
leaves ``overlap_comm`` at that default. See :func:`dp_overlaps_backward`."""


def sbh_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """Bytes of one micro-batch's ``s b h`` activation: what a TP all-reduce and a pipeline
    send move (before scatter/gather splits it over the TP ranks)."""
    return model.seq_len * layout.micro_batch * model.hidden * dtype_bytes(dtype)


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
    n_bytes = sbh_bytes(model, layout, dtype)
    return tp_allreduce_equivalents(layout) * _tp_one_allreduce_s(n_bytes, layout, spec,
                                                                  level, cluster)


def tp_allreduce_equivalents(layout: Layout) -> float:
    """TP traffic of one layer and micro-batch in all-reduces of ``s b h``: 4, 6 with full
    recompute (:func:`tp_allreduce_time_s`). Sequence parallelism replaces each all-reduce
    by an all-gather and a reduce-scatter of half its ring volume each, one of each where
    the all-reduce was (Korthikanti et al. 2022, section 4.2.2: "the same communication
    volume"), and adds the backward's re-gather of the two stored input shards: one
    all-reduce's worth more. All of it is charged here, as the built-in trainer waits for
    each collective; what Megatron's stacks hide behind the backward GEMMs is
    :func:`tp_hidden_time_s`."""
    count = 6.0 if layout.recompute == "full" else 4.0
    return count + (1.0 if layout.sequence_parallel else 0.0)


def tp_hidden_time_s(model: ModelConfig, layout: Layout, spec: DeviceSpec, level: str,
                     dtype: str, *, cluster: ClusterConfig | None = None) -> float:
    """TP time of one layer and micro-batch that Megatron's column-parallel linears (QKV
    and the MLP's first) hide behind their own backward GEMMs, where the stack does
    (:func:`autotune.models.stacks.hides_tp_backward`).
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``
    (deepspeedai/Megatron-DeepSpeed@4efb479 ``megatron/core/tensor_parallel/layers.py``)
    issues the input gradient's all-reduce (with sequence parallelism its reduce-scatter)
    asynchronously, then computes the weight gradient, then waits; with sequence
    parallelism the re-gather of the stored input shard runs beside the input-gradient
    GEMM the same way. Each collective is hidden up to its GEMM's time: the backward's
    GEMMs of a linear have its forward's shape (:func:`autotune.models.compute.
    shaped_gemm_time_s`), and the collectives are the backward's 2 all-reduces (with
    sequence parallelism 2 reduce-scatters and 2 re-gathers, half an all-reduce each) that
    :func:`tp_allreduce_equivalents` charges."""
    if layout.tp == 1:
        return 0.0
    t, h, tokens = layout.tp, model.hidden, layout.micro_batch * model.seq_len
    one = _tp_one_allreduce_s(sbh_bytes(model, layout, dtype), layout, spec, level, cluster)
    peak = spec.peak_flops_or_fallback(dtype)
    outputs = (model.qkv_width // t, (model.mlp_matrices - 1) * (model.ffn // t))  # QKV, up
    hidden = 0.0
    for n in outputs:
        gemm = shaped_gemm_time_s(tokens, n, h, peak, spec)
        if layout.sequence_parallel:
            hidden += 2 * min(0.5 * one, gemm)  # reduce-scatter | wgrad, re-gather | dgrad
        else:
            hidden += min(one, gemm)  # all-reduce | wgrad
    return hidden


def _tp_one_allreduce_s(n_bytes: float, layout: Layout, spec: DeviceSpec, level: str,
                        cluster: ClusterConfig | None) -> float:
    if layout.tp == 1:
        return 0.0
    if level == "inter_node" and cluster is not None:
        groups = tp_group_placements(layout.tp, layout.world_size, cluster.devices_per_node)
        return group_allreduce_time_s(n_bytes, groups, layout.tp, layout, cluster)
    return ring_allreduce_time_s(n_bytes, layout.tp, link_spec(spec, level))


def p2p_time_s(model: ModelConfig, layout: Layout, link: LinkSpec, dtype: str, *,
               gather_s: float = 0.0) -> float:
    """Point-to-point traffic of one stage for one micro-batch over ``link``: the ``s b h``
    activation sent forward and its gradient sent back (Narayanan et al. 2021, sec. 4.1),
    each split over the ``t`` TP ranks and all-gathered on arrival in ``gather_s``
    (:func:`autotune.models.network.p2p_message_time_s`: Megatron's scatter/gather, and
    DeepSpeed's ``pipe_partitioned``, both on by default)."""
    if layout.pp == 1:
        return 0.0
    n_bytes = sbh_bytes(model, layout, dtype)
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
    (:func:`autotune.models.cost.pipeline_time_s`).
    """
    p = layout.pp
    if p == 1:
        return [0.0]
    spec = cluster.device_spec()
    place = pipeline_placement(layout.tp, layout.dp, p, cluster.devices_per_node,
                               spec.devices_per_card)
    n_bytes = sbh_bytes(model, layout, dtype)
    gather = 0.5 * _tp_one_allreduce_s(n_bytes, layout, spec, tp_link(layout, cluster),
                                       cluster)
    network = network_link(place.senders_per_node, cluster.network())
    per_boundary = []
    for crosses, card in zip(place.crosses_nodes, place.within_card, strict=True):
        link = network if crosses else spec.intra_card if card else spec.intra_node
        per_boundary.append(p2p_time_s(model, layout, link, dtype, gather_s=gather))
    return [max(per_boundary[max(0, s - 1)], per_boundary[min(s, p - 2)]) for s in range(p)]


def dp_reduce_time_s(n_params: int, layout: Layout, cluster: ClusterConfig,
                     dtype: str, *, bytes_per_param: float | None = None) -> float:
    """Data-parallel gradient reduction per step: an all-reduce of the stage's gradients
    (ZeRO-1/2: a reduce-scatter plus the all-gather of the updated weights, the same
    volume; Rajbhandari et al. 2020, section 7) in every DP group at once, timed by the
    slowest group (:func:`group_allreduce_time_s`): a ring over the card or node link
    inside a node; across nodes the ring or the hierarchical tree with every rank of the
    node reducing at once and sharing its NICs (all TP ranks' groups, and with a pipeline
    all stages': DeepSpeed's pipeline engine reduces after the last micro-batch on every
    stage, :func:`dp_overlaps_backward`). ``bytes_per_param``: what the training stack
    moves per parameter where it is not the model's dtype
    (:func:`autotune.models.stacks.dp_reduce_bytes_per_param`)."""
    if layout.dp == 1:
        return 0.0
    groups = dp_group_placements(layout.tp, layout.dp, layout.pp, cluster.devices_per_node)
    per_param = bytes_per_param if bytes_per_param is not None else dtype_bytes(dtype)
    return group_allreduce_time_s(n_params * per_param, groups,
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
