"""The memory prediction's error bar: each term's sd by hand, the probability, the verdict."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from autotune.config.model import MODEL_PRESETS, ModelConfig
from autotune.layout import Layout
from autotune.models import memory as mem
from autotune.models import memory_uncertainty as unc
from autotune.models.memory_uncertainty import FitVerdict

M = ModelConfig(n_layer=4, hidden=64, n_head=4, seq_len=32, vocab_size=100, ffn_hidden=256)
GiB = 2**30


def lay(**kw) -> Layout:
    base = {"tp": 1, "pp": 1, "dp": 4, "micro_batch": 2, "grad_accum": 4}
    return Layout(**{**base, **kw})


@pytest.mark.parametrize(("kw", "dtype", "expected"), [
    # bf16 ZeRO-1: BF16_Optimizer (6 bytes) or DeepSpeedZeroOptimizer (2 + 2/dp): B = 3.5
    ({"zero_stage": 1}, "bf16", 1000 * 3.5 / 2),
    # bf16 ZeRO-0 with a pipeline: fp32 or bf16 accumulation buffer: B = 2
    ({"zero_stage": 0, "pp": 2}, "bf16", 1000 * 2 / 2),
    # bf16 ZeRO-0 without: BF16_Optimizer (6) or FP16_Optimizer on bf16 (2): B = 4
    ({"zero_stage": 0}, "bf16", 1000 * 4 / 2),
    ({"zero_stage": 2}, "bf16", 0),   # one path: partitioned bf16 gradients
    ({"zero_stage": 1}, "fp32", 0),
])
def test_grad_accumulation_sd_is_half_the_recipe_difference(kw, dtype, expected) -> None:
    assert unc.grad_accumulation_sigma_bytes(1000, lay(**kw), dtype) == int(expected)


def test_flat_partition_logits_buffers_runtime_fragmentation_by_hand() -> None:
    assert unc.flat_partition_sigma_bytes(1000, lay(zero_stage=1)) == 2 * 1000 // 4
    assert unc.flat_partition_sigma_bytes(1000, lay(zero_stage=3)) == 0
    # one fp32 copy of the logits, on the stage that has them
    assert unc.logits_sigma_bytes(M, lay(tp=4), "last") == 4 * 32 * 2 * 25
    assert unc.logits_sigma_bytes(M, lay(), "first") == 0
    n = mem.params_per_rank(M, lay(), "only")
    buf, temp = mem.buffer_bytes(M, lay(), "bf16", n), mem.optimizer_temp_bytes(n, lay())
    assert unc.buffer_sigma_bytes(M, lay(), "bf16", n) == int(math.hypot(buf / 2, temp / 2))
    assert unc.runtime_sigma_bytes("h100") == int(mem.runtime_bytes("h100") / 3)
    assert unc.runtime_sigma_bytes("cpu") == int(0.10 * mem.runtime_bytes("cpu"))
    # recompute and ZeRO-3 make the allocator's pattern irregular (GMLake): twice the sd
    assert unc.fragmentation_sigma_bytes(lay(), 1000) == 50
    assert unc.fragmentation_sigma_bytes(lay(recompute="full"), 1000) == 100
    assert unc.fragmentation_sigma_bytes(lay(zero_stage=3), 1000) == 100


def test_activation_sd_uncounted_share_and_one_layer() -> None:
    one = mem.layer_activation_bytes(M, lay(), "bf16")
    stored = mem.activation_bytes(M, lay(), "bf16", "only")
    assert unc.activation_sigma_bytes(M, lay(), "bf16", stored) == int(
        math.hypot(0.10 * stored, one))


def test_combined_sigma_is_the_quadrature_sum_of_the_terms() -> None:
    model = MODEL_PRESETS["gpt-1.3b"]
    layout = Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=4, zero_stage=1)
    est = mem.estimate_memory(model, layout, dtype="bf16", device="h100")
    u = unc.estimate_uncertainty(model, layout, est, dtype="bf16", device="h100")
    assert u.peak_bytes == est.peak_bytes
    assert u.sigma_bytes == int(math.sqrt(sum(s * s for _, s in u.terms)))
    assert {"grad_accumulation", "activations", "runtime", "fragmentation"} <= dict(u.terms).keys()
    assert 0.05 < u.relative_sigma < 0.5


def test_fit_probability_is_a_lognormal_around_the_corrected_median() -> None:
    cv = 0.1
    s = unc.log_sigma(cv)
    assert s == pytest.approx(math.sqrt(math.log1p(cv * cv)))
    assert unc.fit_probability(50 * GiB, 50 * GiB, cv) == pytest.approx(0.5)
    # one log-sd of headroom: Phi(1)
    assert unc.fit_probability(50 * GiB, 50 * GiB * math.exp(s), cv) == pytest.approx(0.8413, 1e-3)
    # monotone in the capacity, and a correction moves the median
    ps = [unc.fit_probability(50 * GiB, c * GiB, cv) for c in (40, 45, 50, 55, 60)]
    assert ps == sorted(ps)
    assert unc.fit_probability(50 * GiB, 55 * GiB, cv, correction=1.1) == pytest.approx(0.5)
    # the correction's own uncertainty widens the distribution: P(fit) moves towards 1/2
    sure = unc.fit_probability(50 * GiB, 60 * GiB, cv)
    unsure = unc.fit_probability(50 * GiB, 60 * GiB, cv, correction_sigma=0.2)
    assert 0.5 < unsure < sure
    # without any spread it is the old comparison
    assert unc.fit_probability(50 * GiB, 49 * GiB, 0.0) == 0.0
    assert unc.fit_probability(50 * GiB, 51 * GiB, 0.0) == 1.0


def test_verdict_thresholds() -> None:
    assert unc.classify_fit(0.01, 0.025) is FitVerdict.EXCEEDS
    assert unc.classify_fit(0.025, 0.025) is FitVerdict.UNCERTAIN
    assert unc.classify_fit(0.5, 0.025) is FitVerdict.UNCERTAIN
    assert unc.classify_fit(0.975, 0.025) is FitVerdict.FITS
    assert unc.classify_fit(0.0, 0.0) is not FitVerdict.EXCEEDS  # 0 never excludes


def test_an_oom_conditions_its_siblings() -> None:
    # Headroom in sds (P(fit) = Phi(z)). A sibling with no more headroom than the OOM
    # cannot fit; one with much more barely moves.
    assert unc.oom_conditioned_p_fit(1.9, 2.0) == 0.0
    assert unc.oom_conditioned_p_fit(5.0, 0.0) == pytest.approx(1.0, abs=1e-6)
    # an OOM where the model was sure (z = 2.33, P(fit) 99%) moves a sibling at 99.5% to 1/2
    assert unc.oom_conditioned_p_fit(2.5758, 2.3263) == pytest.approx(0.5, abs=1e-3)
    # both far beyond what float P(fit) can tell apart from 1: still ordered by headroom
    assert unc.oom_conditioned_p_fit(41.0, 40.0) == pytest.approx(1.0)
    assert 0.2 < unc.oom_conditioned_p_fit(40.01, 40.0) < 0.5


def test_a_run_conditions_its_siblings() -> None:
    # A sibling that ran with less headroom than this layout: it fits.
    assert unc.run_conditioned_p_fit(1.0, 0.5) == 1.0
    # One that ran with more: P(e <= z | e <= z_ran) = Phi(z) / Phi(z_ran), above Phi(z).
    phi = NormalDist().cdf
    assert unc.run_conditioned_p_fit(0.0, 1.0) == pytest.approx(phi(0.0) / phi(1.0))
    assert unc.run_conditioned_p_fit(0.0, 1.0) > phi(0.0)
    # With an OOM below: the error lies between the two headrooms.
    expected = (phi(0.5) - phi(0.0)) / (phi(1.0) - phi(0.0))
    assert unc.run_conditioned_p_fit(0.5, 1.0, 0.0) == pytest.approx(expected)
    assert unc.run_conditioned_p_fit(-0.1, 1.0, 0.0) == 0.0  # no more headroom than the OOM
    # Trials against the model's order (the run with less headroom than the OOM): the
    # OOM's condition alone.
    assert unc.run_conditioned_p_fit(0.5, 0.1, 0.3) == unc.oom_conditioned_p_fit(0.5, 0.3)
