"""Each cost-model term against a hand computation, and the model's qualitative shape."""

from __future__ import annotations

import math

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS, ModelConfig
from autotune.hardware import LinkSpec, get_device
from autotune.layout import Layout
from autotune.models import communication, compute, cost, links, network, profile_blend

M = ModelConfig(n_layer=8, hidden=1024, n_head=16, seq_len=1024, vocab_size=51200)
A100 = ClusterConfig(nodes=1, devices_per_node=8, device="a100-80gb")
PVC = ClusterConfig(nodes=2, devices_per_node=8, device="max1550-tile")


def lay(**kw) -> Layout:
    base = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "grad_accum": 1}
    return Layout(**{**base, **kw})


def test_ring_allreduce() -> None:
    link = LinkSpec(gbps=100.0, latency_us=10.0)
    assert network.ring_allreduce_time_s(1e9, 1, link) == 0.0
    assert math.isclose(network.ring_allreduce_time_s(1e9, 4, link),
                        2 * 3 / 4 * 1e9 / 100e9 + 2 * 3 * 10e-6)


def test_tp_allreduces_per_layer() -> None:
    spec = get_device("a100-80gb")
    one = network.ring_allreduce_time_s(1024 * 2 * 1024 * 2, 4, spec.intra_node)
    assert math.isclose(communication.tp_allreduce_time_s(M, lay(tp=4, micro_batch=2), spec,
                                                 "intra_node", "bf16"), 4 * one)
    full = lay(tp=4, micro_batch=2, recompute="full")
    assert math.isclose(communication.tp_allreduce_time_s(M, full,
                                                 spec, "intra_node", "bf16"), 6 * one)
    assert communication.tp_allreduce_time_s(M, lay(), spec, "none", "bf16") == 0.0


def test_link_levels_follow_the_rank_order() -> None:
    # Max 1550: 2 tiles per card, 8 per node
    assert links.link_level(1, PVC, 2) == "none"
    assert links.link_level(2, PVC, 2) == "intra_card"
    assert links.link_level(8, PVC, 2) == "intra_node"
    assert links.link_level(16, PVC, 2) == "inter_node"


def test_gemm_efficiency_rises_with_work_and_saturates() -> None:
    perf = get_device("a100-80gb")
    peak = 312e12
    effs = [compute.gemm_efficiency(w, peak, perf) for w in (1e8, 1e9, 1e10, 1e11, 1e13)]
    assert effs == sorted(effs) and effs[-1] < perf.gemm_efficiency_max
    w_half = peak * perf.gemm_efficiency_max * compute.GEMM_RAMP_S
    assert math.isclose(compute.gemm_efficiency(w_half, peak, perf), perf.gemm_efficiency_max / 2)
    assert math.isclose(compute.gemm_time_s(w_half, peak, perf),
                        2 * w_half / (peak * perf.gemm_efficiency_max))


def test_pipeline_bubble_1f1b() -> None:
    # equal stages: (m + p - 1) t, a bubble of (p - 1) / m
    assert math.isclose(cost.pipeline_time_s([1.0] * 4, 8), 11.0)
    assert math.isclose(cost.pipeline_time_s([1.0, 1.0, 2.0], 4), 3 * 2.0 + 4.0)


def test_p2p_dp_zero3_optimizer_terms() -> None:
    spec = get_device("a100-80gb")
    act = 1024 * 1 * 1024 * 2
    link = spec.inter_node
    assert math.isclose(communication.p2p_time_s(M, lay(pp=2), link, "bf16"),
                        2 * (act / (link.gbps * 1e9) + link.latency_us * 1e-6))
    assert communication.p2p_time_s(M, lay(), link, "bf16") == 0.0
    # inside one node (A100: dp = 4 of 8 GPUs) a ring over NVLink
    nvlink = spec.intra_node
    assert math.isclose(communication.dp_reduce_time_s(1000, lay(dp=4), A100, "bf16"),
                        network.ring_allreduce_time_s(2000, 4, nvlink))
    z3 = communication.zero3_gather_time_s(1000, lay(dp=4, zero_stage=3), A100, "bf16")
    assert math.isclose(z3, 3 * (3 / 4 * 2000 / (nvlink.gbps * 1e9)
                                 + 3 * nvlink.latency_us * 1e-6))
    assert communication.zero3_gather_time_s(1000, lay(dp=4, zero_stage=1), A100, "bf16") == 0.0
    assert math.isclose(compute.optimizer_time_s(1000, lay(dp=4, zero_stage=1), spec, "bf16"),
                        250 * 30 / (spec.hbm_gbps * 1e9))


def test_breakdown_adds_up_and_throughput_is_consistent() -> None:
    for layout in (lay(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=8, zero_stage=1),
                   lay(dp=8, micro_batch=4, grad_accum=2, zero_stage=3, recompute="full")):
        est = cost.estimate_step(M, layout, A100)
        parts = (est.compute_s + est.tp_comm_s + est.host_s + est.pp_p2p_s + est.bubble_s
                 + est.zero3_comm_s + est.dp_comm_s + est.optimizer_s)
        assert math.isclose(parts, est.step_time_s, rel_tol=1e-9)
        from autotune.models.flops import model_flops_per_step
        assert math.isclose(est.model_tflops_per_device, model_flops_per_step(
            M, layout.global_batch) / (est.step_time_s * 8) / 1e12)


def test_shape_bubble_and_cross_node_tp_and_microbatch() -> None:
    m = MODEL_PRESETS["gpt-18.4b"]
    def tflops(layout: Layout, cluster: ClusterConfig = PVC) -> float:
        return cost.estimate_step(m, layout, cluster).model_tflops_per_device
    # more micro-batches, smaller bubble
    assert tflops(lay(pp=8, dp=2, grad_accum=64)) > tflops(lay(pp=8, dp=2, grad_accum=8))
    # TP over the slow Xe Link between cards is worse than within a card
    assert tflops(lay(tp=2, dp=8, grad_accum=8)) > tflops(lay(tp=4, dp=4, grad_accum=16))
    # a tiny model gains from bigger micro-batches (bigger GEMMs, less overhead)
    small = MODEL_PRESETS["gpt-1.3b"]
    a = cost.estimate_step(small, lay(dp=8, micro_batch=1, grad_accum=8), A100)
    b = cost.estimate_step(small, lay(dp=8, micro_batch=8, grad_accum=1), A100)
    assert b.model_tflops_per_device > a.model_tflops_per_device
    assert b.gemm_efficiency > a.gemm_efficiency


def test_calibrate_is_the_geometric_mean_ratio() -> None:
    assert math.isclose(profile_blend.calibrate([1.0, 2.0], [2.0, 8.0]), math.sqrt(2 * 4))
    assert profile_blend.calibrate([], []) == 1.0
    with pytest.raises(ValueError):
        profile_blend.calibrate([1.0], [1.0, 2.0])


def test_host_overlap_hides_the_shorter_side_unless_balanced() -> None:
    # balanced host and device: HOST_SERIAL_FRACTION of the shorter side is exposed
    assert math.isclose(compute.host_exposed_time_s(1.0, 1.0), compute.HOST_SERIAL_FRACTION)
    # overhead-bound (host 2x device): 2 + 0.25 * 1 * (1/2) - 1 beyond the device time
    assert math.isclose(compute.host_exposed_time_s(1.0, 2.0),
                        1.0 + compute.HOST_SERIAL_FRACTION / 2)
    # device-bound 10:1: the host is almost fully hidden
    assert math.isclose(compute.host_exposed_time_s(10.0, 1.0), compute.HOST_SERIAL_FRACTION / 10)
    assert compute.host_exposed_time_s(0.0, 0.0) == 0.0
