"""The memory and step-time terms of MiCS, hpZ and DeepSpeed-Ulysses
(autotune/models/zero_variants.py, autotune/models/ulysses.py) as the models compose them."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.models.memory import estimate_memory, model_state_bytes
from autotune.models.ulysses import alltoall_bytes_per_layer

MODEL = MODEL_PRESETS["gpt-18.4b"]
AURORA = ClusterConfig(nodes=4, devices_per_node=12, device="max1550-tile")


def _z3(**kw: Any) -> Layout:
    args: dict[str, Any] = {"tp": 1, "pp": 1, "dp": 48, "micro_batch": 1, "grad_accum": 4,
                            "zero_stage": 3, "recompute": "full"}
    return Layout(**{**args, **kw})


def test_mics_shards_every_state_over_its_partition_group() -> None:
    n = 48 * 10**6
    plain = model_state_bytes(n, _z3(), "bf16")
    mics = model_state_bytes(n, _z3(zero_variant="mics", zero_shard=12), "bf16")
    assert [m / p for m, p in zip(mics, plain, strict=True)] == pytest.approx([4, 4, 4])
    # A partition group of the whole ZeRO group is plain ZeRO-3.
    assert model_state_bytes(n, _z3(zero_variant="mics", zero_shard=48), "bf16") == plain


def test_hpz_adds_the_secondary_weight_copy_only() -> None:
    n = 48 * 10**6
    w, g, o = model_state_bytes(n, _z3(), "bf16")
    hw, hg, ho = model_state_bytes(n, _z3(zero_variant="hpz", zero_shard=12), "bf16")
    assert (hg, ho) == (g, o)
    assert hw - w == pytest.approx(2 * n / 12, rel=1e-6)


def test_ulysses_widens_the_zero_group_and_splits_the_activations() -> None:
    one = Layout(tp=1, pp=1, dp=4, micro_batch=2, grad_accum=1, zero_stage=1)
    uly = Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=2, zero_stage=1, ulysses=2)
    n = 10**6
    assert model_state_bytes(n, uly, "bf16") == model_state_bytes(n, one, "bf16")
    a = estimate_memory(MODEL, one, dtype="bf16", device="max1550-tile")
    b = estimate_memory(MODEL, uly, dtype="bf16", device="max1550-tile")
    assert b.activations_bytes == pytest.approx(a.activations_bytes / 2, rel=1e-6)


def test_mics_gathers_inside_the_node_and_adds_the_replica_reduce() -> None:
    plain = estimate_step(MODEL, _z3(), AURORA)
    mics = estimate_step(MODEL, _z3(zero_variant="mics", zero_shard=12), AURORA)
    hpz = estimate_step(MODEL, _z3(zero_variant="hpz", zero_shard=12), AURORA)
    assert mics.zero3_comm_s < hpz.zero3_comm_s < plain.zero3_comm_s
    assert mics.dp_comm_s > 0 == plain.dp_comm_s == hpz.dp_comm_s
    whole = estimate_step(MODEL, _z3(zero_variant="mics", zero_shard=48), AURORA)
    assert whole.step_time_s == pytest.approx(plain.step_time_s)


def test_ulysses_all_to_alls_cost_time_and_the_compute_is_shared() -> None:
    one = Layout(tp=1, pp=1, dp=48, micro_batch=1, grad_accum=4, zero_stage=1)
    uly = Layout(tp=1, pp=1, dp=24, micro_batch=1, grad_accum=8, zero_stage=1, ulysses=2)
    a, b = estimate_step(MODEL, one, AURORA), estimate_step(MODEL, uly, AURORA)
    assert b.compute_s == pytest.approx(a.compute_s, rel=1e-6)  # twice the micro-batches
    assert b.tp_comm_s > a.tp_comm_s == 0.0
    assert alltoall_bytes_per_layer(MODEL, uly, "bf16") == pytest.approx(
        2 * 1 * MODEL.seq_len / 2 * MODEL.hidden * 4 * 2 * 0.5)
