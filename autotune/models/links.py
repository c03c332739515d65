"""Which link a group of ranks crosses, and one all-reduce in every group of a kind.

A group of consecutive ranks that fits one card talks over the card's tile link, one that
fits a node over the node's fabric, a larger one over the network
(:mod:`autotune.models.network` prices what crosses nodes). Part of the analytic step
time of :mod:`autotune.models.cost`.
"""

from __future__ import annotations

from autotune.config.cluster import ClusterConfig
from autotune.hardware import DeviceSpec, LinkSpec
from autotune.layout import Layout
from autotune.models.network import GroupPlacement, allreduce_time_s, tp_group_placements

__all__ = ["group_allreduce_time_s", "link_level", "link_spec", "tp_link"]

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
    return link_spec(spec, level)


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


def link_spec(spec: DeviceSpec, level: str) -> LinkSpec:
    """The device's link of ``level`` (a :func:`link_level` name)."""
    return getattr(spec, level)
