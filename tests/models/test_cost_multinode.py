"""The cost model's terms across nodes (models/network.py and their use in models/cost.py):
hand-computed values, monotonicity, and a ranking against published figures."""

from __future__ import annotations

import math

import pytest

from autotune.config.cluster import ClusterConfig, LinkConfig
from autotune.config.model import ModelConfig
from autotune.errors import SpecError
from autotune.hardware import LinkSpec, NetworkSpec, get_device
from autotune.layout import Layout
from autotune.models import communication, compute, cost, links, network
from autotune.models.memory import dtype_bytes

A100 = get_device("a100-80gb")
NVLINK = A100.intra_node
DGX = NetworkSpec(node_gbps=200.0, device_gbps=25.0, latency_us=10.0)
M = ModelConfig(n_layer=8, hidden=1024, n_head=16, seq_len=1024, vocab_size=51200)


def dgx(nodes: int, **links: float) -> ClusterConfig:
    return ClusterConfig(nodes=nodes, devices_per_node=8, device="a100-80gb",
                         links=LinkConfig(**links))


def lay(**kw) -> Layout:
    base = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "grad_accum": 1}
    return Layout(**{**base, **kw})


# --- the node's NICs -------------------------------------------------------------------

def test_nvlink_is_what_nccl_moves_on_each_generation() -> None:
    # NCCL's maintainer: ~230 GB/s on an A100 (nccl-tests#149), 370 on an H100 (#212)
    assert A100.intra_node.gbps == 230.0 and get_device("a100-40gb").intra_node == NVLINK
    assert math.isclose(get_device("h100").intra_node.gbps, 370.0)
    assert math.isclose(get_device("h200").intra_node.gbps, 370.0)


def test_network_from_the_table_and_the_overrides() -> None:
    # 8 x HDR200 per DGX A100, each 24 of its 25 GB/s as NCCL moves it (hardware.py)
    assert dgx(8).network() == NetworkSpec(192.0, 24.0, 10.0)
    h100 = ClusterConfig(nodes=2, devices_per_node=8, device="h100").network()
    assert (h100.node_gbps, h100.device_gbps) == (384.0, 48.0)     # 8 x NDR400 per DGX H100
    aurora = ClusterConfig(nodes=8, devices_per_node=12, device="max1550-tile").network()
    assert math.isclose(aurora.node_gbps, 200.0) and aurora.device_gbps == 25.0
    lrz = ClusterConfig(nodes=2, devices_per_node=8, device="max1550-tile").network()
    assert math.isclose(lrz.node_gbps, 8 * 200.0 / 12)             # estimate: Aurora's share
    # cluster.links.inter_node_gbps keeps its meaning: the per-device share of a full node
    slow = dgx(2, inter_node_gbps=12.5).network()
    assert (slow.node_gbps, slow.device_gbps) == (100.0, 24.0)
    fast = dgx(2, inter_node_gbps=50.0).network()
    assert (fast.node_gbps, fast.device_gbps) == (400.0, 50.0)     # reach >= the share
    # the new fields: the node's NICs and one device's reach, each overridable
    two_nics = dgx(2, node_nic_gbps=50.0).network()
    assert (two_nics.node_gbps, two_nics.device_gbps) == (50.0, 24.0)
    assert dgx(2, nic_gbps=40.0).network().device_gbps == 40.0
    assert LinkConfig.from_dict({"node_nic_gbps": 400, "nic_gbps": 50}).node_nic_gbps == 400.0
    with pytest.raises(SpecError):
        LinkConfig.from_dict({"node_nics": 8})


def test_nic_share_is_the_fair_share_capped_by_one_nic() -> None:
    aurora = NetworkSpec(node_gbps=200.0, device_gbps=25.0, latency_us=20.0)
    assert math.isclose(network.nic_share_gbps(12, aurora), 200.0 / 12)  # all 12 tiles
    assert network.nic_share_gbps(6, aurora) == 25.0                     # one NIC each
    assert network.nic_share_gbps(1, aurora) == 25.0
    assert all(network.nic_share_gbps(r, DGX) == 25.0 for r in range(1, 9))


# --- where the ranks sit ---------------------------------------------------------------

def test_group_placements_follow_the_rank_order() -> None:
    # dp groups of tp = 2, dp = 8, pp = 1 on 8-GPU nodes: 4 ranks on each of 2 nodes
    assert network.dp_group_placements(2, 8, 1, 8) == (network.GroupPlacement(8, 2, 4, 4),)
    # tp = 8, dp = 4: one DP rank per node
    assert network.dp_group_placements(8, 4, 1, 8) == (network.GroupPlacement(4, 4, 1, 1),)
    # tp = 1, dp = 8, pp = 2 on 12-tile nodes: stage 1's group straddles nodes 0 and 1
    assert network.dp_group_placements(1, 8, 2, 12) == (
        network.GroupPlacement(8, 1, 8, 8), network.GroupPlacement(8, 2, 4, 4))
    # tp = 8 on 12-tile nodes: every third TP group straddles
    assert network.tp_group_placements(8, 96, 12) == (
        network.GroupPlacement(8, 1, 8, 8), network.GroupPlacement(8, 2, 4, 4))
    aurora = ClusterConfig(nodes=8, devices_per_node=12, device="max1550-tile")
    assert links.tp_link(lay(tp=8, dp=12), aurora) == "inter_node"
    assert links.tp_link(lay(tp=4, dp=24), aurora) == "intra_node"
    assert links.tp_link(lay(tp=2, dp=48), aurora) == "intra_card"


def test_pipeline_boundaries() -> None:
    # a stage per DGX node: every boundary crosses, 8 senders per node
    p = network.pipeline_placement(8, 1, 4, 8, 1)
    assert p.crosses_nodes == (True, True, True) and p.senders_per_node == 8
    # two stages of 4 ranks per node: the middle boundary crosses; 4 senders per node
    p = network.pipeline_placement(2, 2, 4, 8, 1)
    assert p.crosses_nodes == (False, True, False) and p.senders_per_node == 4
    # 8-rank stages on 12-tile nodes: stage 0 -> 1 sends ranks 4..7 to node 1, stage
    # 1 -> 2 ranks 8..11; ranks 12..15 -> 20..23 stay on node 1
    p = network.pipeline_placement(8, 1, 3, 12, 2)
    assert p.crosses_nodes == (True, True) and p.senders_per_node == 8
    # one node: nothing crosses; tile pairs of one card
    p = network.pipeline_placement(1, 1, 4, 8, 2)
    assert p.crosses_nodes == (False,) * 3 and p.within_card == (True, False, True)
    assert p.senders_per_node == 0


# --- the collectives, by hand ----------------------------------------------------------

def test_flat_ring_across_nodes_by_hand() -> None:
    n = 1e9
    g = network.place_group(0, 1, 16, 8)          # 16 ranks, 8 on each of 2 nodes
    t = network.flat_ring_allreduce_time_s(n, g, NVLINK, 25.0, 10.0)
    # the node's 8 ranks leave it through 8 NICs: 200 GB/s, below NVLink's 300;
    # 2(d-1) = 30 steps, 2(N-1) = 2 of them across the network
    assert math.isclose(t, 2 * 15 / 16 * n / 200e9 + 28 * 5e-6 + 2 * 10e-6)
    one_per_node = network.place_group(0, 8, 4, 8)  # tp = 8: one DP rank per node
    assert math.isclose(network.flat_ring_allreduce_time_s(n, one_per_node, NVLINK, 25.0, 10.0),
                        2 * 3 / 4 * n / 25e9 + 6 * 10e-6)


def test_hierarchical_tree_by_hand() -> None:
    assert [network.tree_busiest_node_traffic(k) for k in (1, 2, 3, 4, 64)] == [0, 1, 1.5, 2, 2]
    n = 1e9
    two = network.place_group(0, 1, 16, 8)
    # chain inside (2n over NVLink) overlaps the tree across (1 message over 8 NICs)
    assert math.isclose(network.hierarchical_allreduce_time_s(n, two, NVLINK, 25.0, 10.0),
                        max(2 * n / (NVLINK.gbps * 1e9), n / 200e9) + 2 * 7 * 5e-6 + 2 * 1 * 10e-6)
    eight = network.place_group(0, 1, 64, 8)
    assert math.isclose(network.hierarchical_allreduce_time_s(n, eight, NVLINK, 25.0, 10.0),
                        max(2 * n / (NVLINK.gbps * 1e9), 2 * n / 200e9)
                        + 2 * 7 * 5e-6 + 2 * 3 * 10e-6)


def test_nccl_picks_the_faster_and_tree_for_small_messages_at_scale() -> None:
    inside = network.place_group(0, 1, 8, 8)
    assert network.allreduce_time_s(1e9, inside, NVLINK, DGX, 8) == \
        network.ring_allreduce_time_s(1e9, 8, NVLINK)
    wide = network.place_group(0, 8, 64, 8)       # 64 nodes, one rank each
    for n in (1e4, 1e9):
        ring = network.flat_ring_allreduce_time_s(n, wide, NVLINK, 25.0, 10.0)
        tree = network.hierarchical_allreduce_time_s(n, wide, NVLINK, 25.0, 10.0)
        assert network.allreduce_time_s(n, wide, NVLINK, DGX, 8) == min(ring, tree)
    # small: 2 * 6 tree steps against the ring's 2 * 63; large: the ring's 2(N-1)/N < 2
    assert (network.hierarchical_allreduce_time_s(1e4, wide, NVLINK, 25.0, 10.0)
            < network.flat_ring_allreduce_time_s(1e4, wide, NVLINK, 25.0, 10.0) / 5)
    assert (network.flat_ring_allreduce_time_s(1e9, wide, NVLINK, 25.0, 10.0)
            < network.hierarchical_allreduce_time_s(1e9, wide, NVLINK, 25.0, 10.0))
    # on 2 nodes the tree puts half the ring's traffic on the network (NVIDIA/nccl#946)
    two = network.place_group(0, 1, 16, 8)
    assert (network.hierarchical_allreduce_time_s(1e9, two, NVLINK, 25.0, 10.0)
            < network.flat_ring_allreduce_time_s(1e9, two, NVLINK, 25.0, 10.0))


def test_p2p_message_scatter_gather_by_hand() -> None:
    link = LinkSpec(25.0, 10.0)
    assert math.isclose(network.p2p_message_time_s(8e6, 8, link, 1e-4),
                        1e6 / 25e9 + 10e-6 + 1e-4)
    assert math.isclose(network.p2p_message_time_s(8e6, 1, link, 1e-4), 8e6 / 25e9 + 10e-6)


def test_stage_p2p_times_use_each_stage_s_slower_boundary() -> None:
    n = M.seq_len * 1 * M.hidden * 2
    # tp = 8, pp = 4 on 4 DGX nodes: every boundary crosses, 8 senders per node
    layout = lay(tp=8, pp=4, grad_accum=4)
    gather = 0.5 * network.ring_allreduce_time_s(n, 8, NVLINK)
    one = 2 * (n / 8 / 24e9 + 10e-6 + gather)  # HDR200 at the 24 GB/s NCCL moves
    assert all(math.isclose(t, one)
               for t in communication.stage_p2p_times_s(M, layout, dgx(4), "bf16"))
    # tp = 2, dp = 2, pp = 4 on 2 nodes: stages 1 and 2 sit beside the crossing boundary
    times = communication.stage_p2p_times_s(M, lay(tp=2, dp=2, pp=4, grad_accum=4), dgx(2), "bf16")
    assert times[0] == times[3] < times[1] == times[2]


def test_dp_overlap_follows_the_engine() -> None:
    assert not communication.dp_overlaps_backward(lay(dp=8, zero_stage=2))      # overlap_comm off
    assert communication.dp_overlaps_backward(lay(dp=8, zero_stage=2), overlap_comm=True)
    assert communication.dp_overlaps_backward(lay(dp=8, zero_stage=3))
    assert not communication.dp_overlaps_backward(lay(pp=2, dp=4, zero_stage=1), overlap_comm=True)
    assert not communication.dp_overlaps_backward(lay(zero_stage=3))             # no DP at all
    assert communication.dp_exposed_time_s(3.0, 1.0, True) == 2.0
    assert communication.dp_exposed_time_s(3.0, 5.0, True) == 0.0
    assert communication.dp_exposed_time_s(3.0, 5.0, False) == 3.0
    # ZeRO-2 without a pipeline now pays its reduction like ZeRO-1
    est1 = cost.estimate_step(M, lay(dp=16, grad_accum=2, zero_stage=1), dgx(2))
    est2 = cost.estimate_step(M, lay(dp=16, grad_accum=2, zero_stage=2), dgx(2))
    assert est2.dp_comm_s == est1.dp_comm_s > 0


# --- monotonicity ----------------------------------------------------------------------

@pytest.mark.parametrize("tp", [1, 2, 8])
def test_dp_time_does_not_fall_as_the_group_spans_more_nodes(tp: int) -> None:
    n_params = 10**9
    times = []
    for nodes in (1, 2, 3, 4, 8, 16, 64):
        cluster = dgx(nodes)
        layout = lay(tp=tp, dp=8 * nodes // tp)
        times.append(communication.dp_reduce_time_s(n_params, layout, cluster, "bf16"))
    assert times == sorted(times)


def test_dp_across_nodes_uses_every_nic_of_the_node() -> None:
    # tp = 1: the node's 8 DP ranks leave it through 8 NICs, not one 25 GB/s link
    n_params = 10**9
    before = network.ring_allreduce_time_s(2 * n_params, 64, A100.inter_node)
    now = communication.dp_reduce_time_s(n_params, lay(dp=64), dgx(8), "bf16")
    assert now < before / 5
    # tp = 8: one DP rank per node, all 8 groups at once: the per-device share, as before
    per_device = communication.dp_reduce_time_s(n_params, lay(tp=8, dp=8), dgx(8), "bf16")
    assert math.isclose(per_device, network.ring_allreduce_time_s(2 * n_params, 8, A100.inter_node))


def test_a_study_override_of_the_per_device_share_still_scales_the_network() -> None:
    layout = lay(tp=8, dp=8)
    base = communication.dp_reduce_time_s(10**9, layout, dgx(8), "bf16")
    half = communication.dp_reduce_time_s(10**9, layout, dgx(8, inter_node_gbps=12.5), "bf16")
    assert math.isclose(half, network.ring_allreduce_time_s(2e9, 8, LinkSpec(12.5, 10.0)))
    assert half > 1.9 * base


def test_tp_across_nodes_is_slower_than_inside() -> None:
    # the same TP = 8 group on one 8-GPU node, and over two 4-GPU nodes; messages of a
    # large model's layer (s b h = 2048 x mb x 8192: 34-134 MB), where the bandwidth
    # decides (for kilobyte messages the table's per-step latencies do: NVLink 5 us, the
    # network 10 us, and a 4-rank chain plus one network hop has fewer steps than an 8-rank
    # ring)
    big = ModelConfig(n_layer=8, hidden=8192, n_head=64, seq_len=2048, vocab_size=51200)
    inside = ClusterConfig(nodes=2, devices_per_node=8, device="a100-80gb")
    across = ClusterConfig(nodes=4, devices_per_node=4, device="a100-80gb")  # 4-GPU nodes
    for mb in (1, 4):
        layout = lay(tp=8, dp=2, micro_batch=mb)
        assert links.tp_link(layout, across) == "inter_node"
        t_in = communication.tp_allreduce_time_s(big, layout, A100, links.tp_link(layout, inside),
                                        "bf16", cluster=inside)
        t_across = communication.tp_allreduce_time_s(big, layout, A100,
                                                     links.tp_link(layout, across),
                                            "bf16", cluster=across)
        assert t_across > t_in
    # and on DGX nodes TP = 16 over 2 nodes costs more per all-reduce than TP = 8 in one
    n = M.seq_len * 4 * M.hidden * dtype_bytes("bf16")
    tp16 = links.group_allreduce_time_s(n, network.tp_group_placements(16, 16, 8), 16,
                                       lay(tp=16), dgx(2))
    assert tp16 > network.ring_allreduce_time_s(n, 8, NVLINK)


def test_a_pipeline_boundary_inside_a_node_is_cheaper_than_across() -> None:
    layout = lay(tp=4, pp=2, grad_accum=8)
    one_node = ClusterConfig(nodes=1, devices_per_node=8, device="a100-80gb")
    two_nodes = ClusterConfig(nodes=2, devices_per_node=4, device="a100-80gb")
    inside = communication.stage_p2p_times_s(M, layout, one_node, "bf16")
    across = communication.stage_p2p_times_s(M, layout, two_nodes, "bf16")
    assert max(inside) < min(across)
    assert (cost.estimate_step(M, layout, one_node).step_time_s
            < cost.estimate_step(M, layout, two_nodes).step_time_s)


# --- against published figures ---------------------------------------------------------

GPT_162B = ModelConfig(n_layer=32, hidden=20480, n_head=128, seq_len=2048, vocab_size=51200)
"""Narayanan et al. 2021 (SC21), sec. 5.4.1, fig. 13: a 162.2B GPT on 64 A100 GPUs (8 DGX
A100 nodes), data parallelism 1, micro-batch 1; 32 layers of hidden size 20480 give 162.2B
parameters with the 51,200-token vocabulary."""


def test_the_162b_model_has_the_papers_size() -> None:
    # Narayanan et al. 2021, sec. 5.1: P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h))
    layers, h, v, s = 32, 20480, 51200, 2048
    p = 12 * layers * h**2 * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h))
    assert round(p / 1e9, 1) == 162.2
    # ours counts the output layer apart from the embedding (untied, as the trainer)
    assert round((GPT_162B.n_params() - v * h) / 1e9, 1) == 162.2


@pytest.mark.parametrize("global_batch", [32, 128])
def test_tp_inside_the_node_and_pp_across_beats_tp_across_nodes(global_batch: int) -> None:
    """Narayanan et al. 2021, sec. 5.4.1 and fig. 13 (batch 32 and 128): of (t, p) =
    (2, 32) ... (32, 2), t = 8 = GPUs per node is the fastest, and TP across nodes (t = 16,
    32) loses. Qualitative: nothing here is fitted to the paper's figures."""
    cluster = ClusterConfig(nodes=8, devices_per_node=8, device="a100-80gb")
    tflops = {}
    for t, p in ((2, 32), (4, 16), (8, 8), (16, 4), (32, 2)):
        layout = Layout(tp=t, pp=p, dp=1, micro_batch=1, grad_accum=global_batch,
                        recompute="full")
        tflops[t] = cost.estimate_step(GPT_162B, layout, cluster).model_tflops_per_device
    assert max(tflops, key=tflops.__getitem__) == 8
    assert tflops[8] > tflops[16] > tflops[32]


# --- what Megatron's column-parallel linears hide ---------------------------------------

GPT_18B = ModelConfig(n_layer=40, hidden=6144, n_head=48, seq_len=2048, vocab_size=51200,
                      attention="explicit", dropout=0.1)


@pytest.mark.parametrize("sp", [False, True])
def test_tp_hidden_time_by_hand(sp: bool) -> None:
    # tp 8 inside a DGX A100: each of the 2 column-parallel linears hides its backward
    # collective up to its own GEMM; the collectives are what tp_allreduce_equivalents
    # charges for the backward (2 all-reduces; with SP 2 reduce-scatters + 2 re-gathers).
    lay = Layout(tp=8, pp=1, dp=32, micro_batch=4, grad_accum=8, recompute="full",
                 sequence_parallel=sp)
    spec, dt, tokens, h = A100, "bf16", 4 * 2048, 6144
    one = communication.ring_allreduce_time_s(tokens * h * dtype_bytes(dt), 8, NVLINK)
    peak = spec.peak_flops_or_fallback(dt)
    gemms = [compute.shaped_gemm_time_s(tokens, n, h, peak, spec) for n in (3 * h // 8, 4 * h // 8)]
    expected = sum(2 * min(one / 2, g) if sp else min(one, g) for g in gemms)
    hidden = communication.tp_hidden_time_s(GPT_18B, lay, spec, "intra_node", dt)
    assert hidden == pytest.approx(expected, rel=1e-9)
    # Never more than the backward's share of what is charged (2 of 6, 4 half ones of 7).
    charged = communication.tp_allreduce_time_s(GPT_18B, lay, spec, "intra_node", dt)
    assert 0 < hidden <= charged * (2 / 7 if sp else 2 / 6) + 1e-12
    assert communication.tp_hidden_time_s(
        GPT_18B, Layout(tp=1, pp=1, dp=256, micro_batch=4, grad_accum=1), spec,
        "intra_node", dt) == 0.0


def test_the_step_hides_tp_only_where_the_stack_does() -> None:
    cluster = dgx(32)
    lay = Layout(tp=8, pp=1, dp=32, micro_batch=4, grad_accum=8, recompute="full")

    def tp_s(stack: str, layout: Layout = lay) -> float:
        return cost.estimate_step(GPT_18B, layout, cluster, stack=stack).tp_comm_s

    hidden = 8 * 40 * communication.tp_hidden_time_s(GPT_18B, lay, A100, "intra_node",
                                                     "bf16", cluster=cluster)
    # Megatron's own optimizer: async_tensor_model_parallel_allreduce on by default.
    assert tp_s("megatron") == pytest.approx(tp_s("deepspeed") - hidden, rel=1e-9)
    assert tp_s("megatron-distributed") == pytest.approx(tp_s("megatron"), rel=1e-12)
    # Under --deepspeed it is off, and the built-in trainer waits for each collective.
    assert tp_s("deepspeed-fused-adam") == tp_s("deepspeed") == tp_s(
        "megatron-deepspeed-either")
    # With sequence parallelism every Megatron stack hides, the trainer does not.
    sp = Layout(**{**lay.to_dict(), "sequence_parallel": True})
    assert tp_s("deepspeed-fused-adam", sp) == pytest.approx(tp_s("megatron", sp))
    assert tp_s("deepspeed-fused-adam", sp) < tp_s("deepspeed", sp)
