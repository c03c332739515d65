"""Memory and traffic of ZeRO-3 over a group smaller than the data-parallel one: MiCS and
hpZ, and ZeRO over DeepSpeed-Ulysses' sequence-data-parallel group.

* MiCS (Zhang et al. 2022, "MiCS: Near-linear Scaling for Training Gigantic Model on
  Public Cloud", arXiv:2205.00119, sections 3.1-3.3): every model state is partitioned over
  a *partition group* of ``s = zero_shard`` consecutive ranks and replicated across the
  ``Z / s`` groups (``Z`` = :attr:`~autotune.layout.Layout.zero_group`). The weights are
  all-gathered and the gradients reduce-scattered inside the partition group each
  micro-batch; at the accumulation boundary the gradient shards are all-reduced across
  the replicas (the second hop of its 2-hop synchronisation, section 3.3).
* hpZ (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant
  Model Training", arXiv:2306.10209, section 3.2): ZeRO-3 keeps its primary partition over
  all ``Z`` ranks and, after the forward all-gather, a *secondary* copy of the 16-bit
  weights partitioned over ``s`` ranks of a node, from which the backward (and recompute)
  all-gathers run; the gradient reduce-scatter stays over the ``Z`` ranks.

Plain ZeRO-3 with Ulysses partitions over ``Z = dp * ulysses`` (DeepSpeed's
``seq_data_parallel_group``). :func:`zero_partition_size` and :func:`hpz_secondary_bytes`
are the memory model's terms (:func:`autotune.models.memory.model_state_bytes`);
:func:`zero3_traffic_time_s` and :func:`replica_reduce_time_s` the step-time model's
(:func:`autotune.models.cost.estimate_step`).

>>> from autotune.layout import Layout
>>> mics = Layout(tp=1, pp=1, dp=48, micro_batch=1, grad_accum=4, zero_stage=3,
...               zero_variant="mics", zero_shard=12)
>>> zero_partition_size(mics), hpz_secondary_bytes(10**9, mics, "bf16")
(12, 0)
>>> hpz = Layout(tp=1, pp=1, dp=48, micro_batch=1, grad_accum=4, zero_stage=3,
...              zero_variant="hpz", zero_shard=12)
>>> zero_partition_size(hpz), hpz_secondary_bytes(12 * 10**9, hpz, "bf16")
(48, 2000000000)
"""

from __future__ import annotations

from autotune.config.cluster import ClusterConfig
from autotune.layout import Layout
from autotune.models.links import group_allreduce_time_s
from autotune.models.network import GroupPlacement, place_group

__all__ = ["zero_partition_size", "hpz_secondary_bytes", "zero3_traffic_time_s",
           "zero_group_reduce_time_s",
           "replica_reduce_time_s", "uses_own_zero_groups"]


def _weight_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def zero_partition_size(layout: Layout) -> int:
    """Ranks the ZeRO partitions of ``layout`` span: MiCS's partition group, else the ZeRO
    group (``dp * ulysses``; hpZ's primary partition is ZeRO-3's)."""
    return layout.zero_shard if layout.zero_variant == "mics" else layout.zero_group


def hpz_secondary_bytes(n_params: int, layout: Layout, dtype: str) -> int:
    """hpZ's secondary copy of the weights: ``n_params / s`` 16-bit weights per rank (ZeRO++
    section 3.2: "a secondary copy of the model parameters ... partitioned within each
    node"); 0 for the other variants."""
    if layout.zero_variant != "hpz":
        return 0
    return n_params * _weight_bytes(dtype) // layout.zero_shard


def uses_own_zero_groups(layout: Layout) -> bool:
    """Whether ZeRO's groups differ from the plain data-parallel ones (a variant, or
    Ulysses widening the ZeRO group): then this module prices the ZeRO traffic."""
    return layout.zero_variant != "none" or layout.ulysses > 1


def _groups(layout: Layout, size: int, stride: int, devices_per_node: int
            ) -> tuple[GroupPlacement, ...]:
    """Distinct placements of the groups of ``size`` ZeRO ranks ``stride`` ZeRO ranks apart
    (ZeRO rank ``k`` of stage 0, TP rank 0 is the world rank ``k * tp``: the ZeRO group
    of Ulysses is consecutive, sequence ranks fastest: Megatron-DeepSpeed's
    ``megatron/core/parallel_state.py``)."""
    z, tp = layout.zero_group, layout.tp
    firsts = sorted({(g % stride) + (g // stride) * stride * size for g in range(z // size)})
    return tuple(sorted({place_group(f * tp + j, stride * tp, size, devices_per_node)
                         for f in firsts for j in range(tp)},
                        key=lambda p: (p.nodes, p.min_per_node, p.max_per_node)))


def _half_allreduce_s(n_bytes: float, layout: Layout, cluster: ClusterConfig, size: int,
                      stride: int) -> float:
    """An all-gather (or reduce-scatter) of ``n_bytes`` in every group of ``size`` ranks:
    half an all-reduce (Rajbhandari et al. 2020, section 7.2.2), as
    :func:`autotune.models.communication.zero3_gather_time_s` prices it."""
    if size <= 1:
        return 0.0
    groups = _groups(layout, size, stride, cluster.devices_per_node)
    span = (size - 1) * stride * layout.tp + 1
    return 0.5 * group_allreduce_time_s(n_bytes, groups, span, layout, cluster)


def zero3_traffic_time_s(n_params: int, layout: Layout, cluster: ClusterConfig,
                         dtype: str) -> float:
    """ZeRO-3 traffic of one micro-batch of a stage holding ``n_params``: the forward
    all-gather, the backward one (and the recompute forward's), the gradient
    reduce-scatter. Plain ZeRO-3 runs all of them over the ZeRO group; MiCS inside its
    partition group; hpZ the backward and recompute gathers inside its secondary group."""
    if layout.zero_stage < 3:
        return 0.0
    n_bytes = n_params * _weight_bytes(dtype)
    backward_gathers = 2 if layout.recompute == "full" else 1
    z = layout.zero_group
    if layout.zero_variant == "mics":
        return (2 + backward_gathers) * _half_allreduce_s(n_bytes, layout, cluster,
                                                          layout.zero_shard, 1)
    full = _half_allreduce_s(n_bytes, layout, cluster, z, 1)
    if layout.zero_variant == "hpz":
        return 2 * full + backward_gathers * _half_allreduce_s(
            n_bytes, layout, cluster, layout.zero_shard, 1)
    return (2 + backward_gathers) * full


def replica_reduce_time_s(n_params: int, layout: Layout, cluster: ClusterConfig,
                          dtype: str) -> float:
    """MiCS's second hop, once per step: the all-reduce of each rank's gradient shard
    (``n_params / s``) across the ``Z / s`` replicas of its partition group, ranks ``s``
    apart (Zhang et al. 2022, section 3.3); 0 for the other variants."""
    if layout.zero_variant != "mics" or layout.zero_group == layout.zero_shard:
        return 0.0
    s = layout.zero_shard
    size = layout.zero_group // s
    groups = _groups(layout, size, s, cluster.devices_per_node)
    span = (size - 1) * s * layout.tp + 1
    return group_allreduce_time_s(n_params * _weight_bytes(dtype) / s, groups, span, layout,
                                  cluster)


def zero_group_reduce_time_s(n_params: int, layout: Layout, cluster: ClusterConfig,
                             dtype: str) -> float:
    """ZeRO-0/1/2's gradient reduction over the whole ZeRO group (``dp * ulysses``: with
    Ulysses the sequence ranks' gradients are reduced together with the replicas'), an
    all-reduce of the stage's gradients."""
    return 2 * _half_allreduce_s(n_params * _weight_bytes(dtype), layout, cluster,
                                 layout.zero_group, 1)
