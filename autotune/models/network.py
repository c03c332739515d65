"""Communication between nodes: where a group's ranks sit, each rank's share of its node's
NICs, and the collectives and pipeline sends that cross the network.

Ranks are ordered ``(pipe, data, model)`` with the model (TP) axis fastest
(:mod:`autotune.layout`, DeepSpeed's ``PipeModelDataParallelTopology``), and node ``i``
holds ranks ``[i n, (i + 1) n)``, ``n = devices_per_node`` (torchrun and srun fill nodes in
rank order). So a TP group is ``tp`` consecutive ranks, a DP group ``dp`` ranks ``tp``
apart, a pipeline stage a block of ``tp * dp`` consecutive ranks.

A node's NICs (:class:`autotune.hardware.NetworkSpec`) are shared by the node's ranks that
send across nodes at the same time (:func:`nic_share_gbps`), and a group with ``k`` ranks
on a node leaves it through ``k`` NICs at once. Every function is one formula citing its
source; the figures are the device table's and the study's ``cluster.links``
(``docs/models.md``, "Across nodes"). Nothing here is fitted to a measured table.

>>> from autotune.hardware import NetworkSpec, get_device
>>> dgx = NetworkSpec(node_gbps=200.0, device_gbps=25.0, latency_us=10.0)  # 8 x HDR200
>>> place_group(0, 1, 16, 8)          # tp = 1, dp = 16: two full DGX A100 nodes
GroupPlacement(ranks=16, nodes=2, min_per_node=8, max_per_node=8)
>>> nvlink = get_device("a100-80gb").intra_node
>>> # 1e9 bf16 gradients over 1, 2 and 8 nodes: each node's 8 GPUs share its 8 NICs
>>> [round(allreduce_time_s(2e9, place_group(0, 1, 8 * n, 8), nvlink, dgx, 8), 4)
...  for n in (1, 2, 8)]
[0.0153, 0.0175, 0.0201]
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass

from autotune.hardware import LinkSpec, NetworkSpec

__all__ = [
    "GroupPlacement",
    "place_group",
    "tp_group_placements",
    "dp_group_placements",
    "PipelinePlacement",
    "pipeline_placement",
    "nic_share_gbps",
    "network_link",
    "ring_allreduce_time_s",
    "flat_ring_allreduce_time_s",
    "tree_busiest_node_traffic",
    "hierarchical_allreduce_time_s",
    "allreduce_time_s",
    "p2p_message_time_s",
]


@dataclass(frozen=True)
class GroupPlacement:
    """How one communicator's ranks spread over nodes."""

    ranks: int
    nodes: int
    """Distinct nodes the group's ranks are on."""
    min_per_node: int
    """Fewest of its ranks on one of those nodes (the node with the fewest NICs in use)."""
    max_per_node: int
    """Most of its ranks on one node (the longest intra-node phase)."""

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def place_group(first: int, stride: int, size: int, devices_per_node: int) -> GroupPlacement:
    """Placement of the group of ranks ``first + i * stride``, ``i < size``.

    >>> place_group(0, 2, 8, 8)   # a DP group at tp = 2, dp = 8: 4 ranks on each of 2 nodes
    GroupPlacement(ranks=8, nodes=2, min_per_node=4, max_per_node=4)
    >>> place_group(8, 1, 8, 12)  # tp = 8 on 12-tile Aurora nodes: the second group straddles
    GroupPlacement(ranks=8, nodes=2, min_per_node=4, max_per_node=4)
    """
    counts = Counter((first + i * stride) // devices_per_node for i in range(size))
    return GroupPlacement(size, len(counts), min(counts.values()), max(counts.values()))


@functools.lru_cache(maxsize=1024)
def tp_group_placements(tp: int, world: int, devices_per_node: int) -> tuple[GroupPlacement, ...]:
    """The distinct placements of a layout's TP groups (``tp`` consecutive ranks each); more
    than one only where ``tp`` and ``devices_per_node`` do not divide each other."""
    return tuple(sorted({place_group(g * tp, 1, tp, devices_per_node)
                         for g in range(max(1, world // tp))}, key=_order))


@functools.lru_cache(maxsize=1024)
def dp_group_placements(tp: int, dp: int, pp: int,
                        devices_per_node: int) -> tuple[GroupPlacement, ...]:
    """The distinct placements of a layout's DP groups: for stage ``s`` and TP rank ``j``,
    the ranks ``s tp dp + j + i tp``, ``i < dp``."""
    return tuple(sorted({place_group(s * tp * dp + j, tp, dp, devices_per_node)
                         for s in range(pp) for j in range(tp)}, key=_order))


def _order(g: GroupPlacement) -> tuple[int, int, int]:
    return (g.nodes, g.min_per_node, g.max_per_node)


@dataclass(frozen=True)
class PipelinePlacement:
    """Where a layout's stage boundaries fall."""

    crosses_nodes: tuple[bool, ...]
    """Per boundary ``s`` (stage ``s`` to ``s + 1``): some rank sends to another node."""
    within_card: tuple[bool, ...]
    """Per boundary: every sender and its receiver share a card."""
    senders_per_node: int
    """Most ranks of one node that send to another node (forward activations or backward
    gradients): in the 1F1B steady state every stage exchanges in the same slot, so these
    share the node's NICs."""


@functools.lru_cache(maxsize=1024)
def pipeline_placement(tp: int, dp: int, pp: int, devices_per_node: int,
                       devices_per_card: int) -> PipelinePlacement:
    """Which of the ``pp - 1`` boundaries cross a node. Stage ``s`` is the block of ranks
    ``[s B, (s + 1) B)``, ``B = tp dp``; its rank ``s B + i`` sends its activation to ``(s +
    1) B + i`` (same data and model coordinates), which sends the gradient back. A boundary
    crosses nodes when ``B >= devices_per_node`` (every pair) or when a node boundary falls
    inside the pair's span (blocks that straddle nodes, or the last stage of one node).

    >>> p = pipeline_placement(tp=8, dp=1, pp=4, devices_per_node=8, devices_per_card=1)
    >>> p.crosses_nodes, p.senders_per_node   # one stage per DGX node
    ((True, True, True), 8)
    >>> pipeline_placement(2, 2, 4, 8, 1).crosses_nodes  # two stages per node
    (False, True, False)
    """
    block = tp * dp
    crosses, card = [], []
    senders: set[int] = set()
    for s in range(pp - 1):
        cross, same_card = False, True
        for i in range(block):
            a = s * block + i
            b = a + block
            if a // devices_per_node != b // devices_per_node:
                cross = True
                senders.update((a, b))
            same_card &= a // devices_per_card == b // devices_per_card
        crosses.append(cross)
        card.append(same_card)
    per_node = Counter(r // devices_per_node for r in senders)
    return PipelinePlacement(tuple(crosses), tuple(card), max(per_node.values(), default=0))


def nic_share_gbps(concurrent_ranks: int, network: NetworkSpec) -> float:
    """One rank's bandwidth into the network while ``concurrent_ranks`` ranks of its node
    send across nodes at once: ``min(device, node / r)``.

    The node's NICs are one resource; flows that share it get equal shares (max-min
    fairness: Bertsekas and Gallager, "Data Networks", 2nd ed. 1992, sec. 6.5.2), and no
    device drives more than its own reach (its NIC: NCCL binds a device to its nearest
    NIC). On a DGX A100 (8 GPUs, 8 HDR NICs) that is 25 GB/s whoever sends; on an Aurora
    node (12 tiles, 8 NICs) 16.7 GB/s when every tile sends and 25 when 8 or fewer do.

    >>> nic_share_gbps(12, NetworkSpec(node_gbps=200.0, device_gbps=25.0, latency_us=20.0))
    16.666666666666668
    """
    return min(network.device_gbps, network.node_gbps / max(1, concurrent_ranks))


def network_link(concurrent_ranks: int, network: NetworkSpec) -> LinkSpec:
    """The network as one rank sees it: its NIC share (:func:`nic_share_gbps`) and the
    network's latency."""
    return LinkSpec(nic_share_gbps(concurrent_ranks, network), network.latency_us)


def ring_allreduce_time_s(n_bytes: float, ranks: int, link: LinkSpec) -> float:
    """Ring all-reduce (Patarasuk and Yuan 2009; NCCL): ``2(n-1)/n`` of the bytes cross
    each device's link, in ``2(n-1)`` latency-bound steps."""
    if ranks <= 1:
        return 0.0
    return (2 * (ranks - 1) / ranks * n_bytes / (link.gbps * 1e9)
            + 2 * (ranks - 1) * link.latency_us * 1e-6)


def flat_ring_allreduce_time_s(n_bytes: float, group: GroupPlacement, intra: LinkSpec,
                               rank_gbps: float, latency_us: float) -> float:
    """NCCL's ring over a group that spans nodes: one ring through all ``d`` ranks, node
    after node, so ``2(d-1)/d`` of the bytes cross every hop, the hops that leave a node
    included (Patarasuk and Yuan 2009: ``2(d-1)(alpha + n / (d beta))``).

    NCCL runs several rings at once (channels), each leaving the node through another of
    its NICs, so the ``k`` ranks of the group on a node carry its traffic out together at
    ``k`` times a rank's NIC share; the hops inside the node run at the intra-node link.
    (A ring's bus bandwidth then approaches the node's NICs: 190 GB/s on 8 H100 with 4 x
    400 Gb/s per node, NVIDIA/nccl#1368.) Of the ``2(d-1)`` steps, ``2(N-1)`` cross the
    network and pay its latency, the rest the intra-node link's, as NCCL's own model
    charges them (NVIDIA/nccl ``src/graph/tuning.cc`` @b6475625, ``ncclTopoTuneModel``:
    ``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat``).
    """
    d, nodes = group.ranks, group.nodes
    if d <= 1:
        return 0.0
    gbps = group.min_per_node * rank_gbps
    if group.max_per_node > 1:
        gbps = min(gbps, intra.gbps)
    inter_steps = 2 * (nodes - 1)
    return (2 * (d - 1) / d * n_bytes / (gbps * 1e9)
            + (2 * (d - 1) - inter_steps) * intra.latency_us * 1e-6
            + inter_steps * latency_us * 1e-6)


def tree_busiest_node_traffic(nodes: int) -> float:
    """The most any node sends across the network in NCCL's double binary tree all-reduce,
    in units of the message: 1 on 2 nodes, 1.5 on 3, 2 from 4 on.

    Two binary trees each reduce and broadcast half of the message; a node sends its half
    to its parent (reduce) and to each child (broadcast), and is interior in at most one of
    the trees (Sanders, Speck and Träff 2009, "Two-tree algorithms for full bandwidth
    broadcast, reduction and scan", sec. 2). From 4 nodes some node has a parent and two
    children in one tree and is a leaf in the other: ``(1 + 2) / 2 + 1 / 2 = 2``; on 3 the
    interior node is a root (``2 / 2 + 1 / 2``); on 2 each node is root of one tree and
    leaf of the other (``1/2 + 1/2``), half the ring's ``~2``: "2x less traffic on the
    network" (S. Jeaugey in NVIDIA/nccl#946).
    """
    if nodes <= 1:
        return 0.0
    return {2: 1.0, 3: 1.5}.get(nodes, 2.0)


def hierarchical_allreduce_time_s(n_bytes: float, group: GroupPlacement, intra: LinkSpec,
                                  rank_gbps: float, latency_us: float) -> float:
    """NCCL's tree all-reduce, hierarchical: a chain through the group's ``k`` ranks inside
    each node, a double binary tree across the ``N`` nodes (Jeaugey 2019, "Massively scale
    your deep learning training with NCCL 2.4"; "we use chain intra-node", NVIDIA/nccl#919).

    Inside, the chain reduces up and broadcasts down: a rank sends the whole message to
    one neighbour (the partial sum) and again to the other (the result), ``2n`` through its
    link, in ``2(k-1)`` latency-bound hops; NCCL's own model likewise gives the tree half
    the ring's algorithm bandwidth per unit of bus bandwidth (``tuning.cc``: ``ratio *=
    .5``). Across, the busiest
    node sends :func:`tree_busiest_node_traffic` messages, spread over the ``k`` NICs of
    its ranks, in ``2 floor(log2 N)`` steps instead of the ring's ``2(N-1)`` (NCCL's model:
    ``2 * ((nRanks/nNodes - 1) * intraLat + log2i(nNodes) * interLat)``, ``tuning.cc``
    @b6475625). NCCL streams
    the message in chunks through chain and trees at once, so the two bandwidth terms
    overlap (the slower counts) and the latencies add. The node with the fewest of the
    group's ranks (fewest NICs in use) and the one with the most (longest chain) bound it.
    A 2D scheme (reduce-scatter in the node, ring all-reduce of ``1/k`` across nodes,
    all-gather: Thakur, Rabenseifner and Gropp 2005, sec. 4.4) would send ``2(N-1)/N`` per
    node; NCCL does not build it ("no 2D ring", NVIDIA/nccl#471), and it equals the tree's
    traffic on 2 nodes.
    """
    if group.ranks <= 1:
        return 0.0
    k, nodes = group.max_per_node, group.nodes
    inside_bw = 2 * n_bytes / (intra.gbps * 1e9) if k > 1 else 0.0
    inside_lat = 2 * (k - 1) * intra.latency_us * 1e-6
    across_bw = (tree_busiest_node_traffic(nodes) * n_bytes
                 / (group.min_per_node * rank_gbps * 1e9))
    across_lat = 2 * math.floor(math.log2(nodes)) * latency_us * 1e-6 if nodes > 1 else 0.0
    return max(inside_bw, across_bw) + inside_lat + across_lat


def allreduce_time_s(n_bytes: float, group: GroupPlacement, intra: LinkSpec,
                     network: NetworkSpec, concurrent_ranks: int) -> float:
    """All-reduce of ``n_bytes`` over ``group``, as NCCL would run it.

    Inside one node: the ring over the intra-node link (:func:`ring_allreduce_time_s`).
    Across nodes: the faster of the flat ring (:func:`flat_ring_allreduce_time_s`) and the
    hierarchical tree (:func:`hierarchical_allreduce_time_s`), each rank at its share of
    the NICs with ``concurrent_ranks`` of its node sending at once (:func:`nic_share_gbps`).
    NCCL builds exactly these two: "a flat ring (high latency, best bandwidth) and a tree
    (low latency, ok bandwidth)", no 2D ring (S. Jeaugey in NVIDIA/nccl#471), and its
    tuning model picks one per call from the number of nodes, GPUs per node, message size
    and intra- and inter-node bandwidths (NVIDIA/nccl#754; NCCL docs, "NCCL_ALGO"): trees
    for small messages at scale, and on 2 nodes; rings for large messages on many.
    """
    if not group.crosses_nodes:
        return ring_allreduce_time_s(n_bytes, group.ranks, intra)
    share = nic_share_gbps(concurrent_ranks, network)
    return min(flat_ring_allreduce_time_s(n_bytes, group, intra, share, network.latency_us),
               hierarchical_allreduce_time_s(n_bytes, group, intra, share, network.latency_us))


def p2p_message_time_s(n_bytes: float, tp: int, link: LinkSpec, gather_s: float) -> float:
    """One activation (or its gradient) of ``n_bytes`` across one stage boundary.

    With TP the ``t`` ranks of a stage hold the same activation. Megatron-LM splits it: each
    rank sends ``n/t`` to its counterpart and the receivers all-gather the pieces over their
    TP group, whose link is fast inside a node (Narayanan et al. 2021, sec. 4.1, "scatter/
    gather communication optimization"; ``scatter_gather_tensors_in_pipeline``, on by
    default, ``megatron/p2p_communication.py`` ``_communicate``). DeepSpeed's pipeline
    engine does the same by default when its grid has model parallelism
    (``pipe_partitioned``/``grad_partitioned`` default true, deepspeedai/DeepSpeed
    ``deepspeed/runtime/config.py`` ``get_pipeline_config`` @3a890ec5;
    ``deepspeed/runtime/pipe/engine.py`` ``_exec_forward_pass`` @03f6f75c partitions the
    output over the slice-parallel group and ``PartitionedTensor.full()`` gathers it).
    ``gather_s`` is that all-gather (half a TP all-reduce of ``n_bytes``).
    """
    return n_bytes / tp / (link.gbps * 1e9) + link.latency_us * 1e-6 + (gather_s if tp > 1 else 0)
