"""The slowest device of a synchronous step (autotune/models/stragglers.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autotune import hardware
from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.models.stragglers import expected_max_standard_normal, straggler_factor

# The expected maximum of n standard normals as tabulated (Harter 1961; David and
# Nagaraja, Order Statistics): closed forms for n = 2 and 3 (1/sqrt(pi), 3/(2 sqrt(pi))).
TABULATED = {2: 1 / math.sqrt(math.pi), 3: 1.5 / math.sqrt(math.pi), 5: 1.16296,
             10: 1.53875, 100: 2.50759, 1000: 3.24144}


@pytest.mark.parametrize("n", sorted(TABULATED))
def test_expected_maximum_matches_the_tables(n: int) -> None:
    assert expected_max_standard_normal(n) == pytest.approx(TABULATED[n], abs=2e-5)


def test_expected_maximum_refuses_no_device() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        expected_max_standard_normal(0)


def test_gpu_spread_is_sinha_et_al_s_variation_over_four_iqr() -> None:
    """8% is the fence-to-fence range (4 IQR) over the median; a normal's IQR is 1.349 sd."""
    assert hardware.NORMAL_IQR == pytest.approx(1.34898, abs=1e-5)
    assert hardware.GPU_SPEED_SD == pytest.approx(0.0148, abs=1e-4)
    gpus = [s for s in hardware.HARDWARE.values() if s.peak_bf16_tflops is not None]
    assert gpus and all(s.speed_sd == hardware.GPU_SPEED_SD for s in gpus)
    assert hardware.get_device("cpu").speed_sd == 0.0


def test_factor_grows_with_the_devices_and_is_one_without_a_spread() -> None:
    sd = hardware.GPU_SPEED_SD
    factors = [straggler_factor(n, sd) for n in (1, 8, 128, 1024, 8192)]
    assert factors[0] == 1.0 and factors == sorted(factors) and len(set(factors)) == 5
    assert factors[2] == pytest.approx(1 + sd * 2.5946, abs=1e-5)
    assert straggler_factor(1024, 0.0) == 1.0


def _gpt13b(nodes: int, dp: int) -> tuple[ClusterConfig, Layout]:
    cluster = ClusterConfig(nodes=nodes, devices_per_node=8, device="a100-80gb")
    return cluster, Layout(tp=2, pp=2, dp=dp, micro_batch=2, grad_accum=8)


def test_step_slows_only_the_devices_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the same device without a spread: compute and optimizer take the factor
    longer, the links (TP, pipeline sends, DP reduction) take what they took."""
    model = MODEL_PRESETS["gpt-1.3b"]
    cluster, lay = _gpt13b(4, 8)
    with_spread = estimate_step(model, lay, cluster)
    spec = hardware.HARDWARE["a100-80gb"]
    monkeypatch.setitem(hardware.HARDWARE, "a100-80gb", replace(spec, speed_sd=0.0))
    without = estimate_step(model, lay, cluster)
    f = with_spread.straggler_factor
    assert without.straggler_factor == 1.0
    assert f == straggler_factor(32, hardware.GPU_SPEED_SD) > 1.0
    assert with_spread.compute_s == pytest.approx(f * without.compute_s, rel=1e-12)
    assert with_spread.optimizer_s == pytest.approx(f * without.optimizer_s, rel=1e-12)
    for link in ("tp_comm_s", "pp_p2p_s", "dp_comm_s"):
        assert getattr(with_spread, link) == getattr(without, link)
    assert with_spread.step_time_s > without.step_time_s


def test_weak_scaling_falls_with_the_devices_at_fixed_per_device_work() -> None:
    """Same layout per replica, 8x the replicas: the per-device throughput falls by the
    slowest-device term besides the reduction's, and by more than without it."""
    model = MODEL_PRESETS["gpt-1.3b"]
    small_c, small = _gpt13b(4, 8)
    large_c, large = _gpt13b(32, 64)
    a, b = estimate_step(model, small, small_c), estimate_step(model, large, large_c)
    assert b.straggler_factor > a.straggler_factor
    efficiency = b.model_tflops_per_device / a.model_tflops_per_device
    device_share = (b.compute_s + b.optimizer_s) / b.step_time_s
    slowdown = b.straggler_factor / a.straggler_factor
    assert efficiency < 1.0
    # At least the device work's share of the slower device's delay is lost.
    assert efficiency <= 1.0 / (1.0 + device_share * (slowdown - 1.0)) + 1e-12
