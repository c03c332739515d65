"""The gated (SwiGLU) MLP through the config, FLOPs, memory and cost models, by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autotune.config.model import MODEL_PRESETS, ModelConfig
from autotune.errors import SpecError
from autotune.hardware import get_device
from autotune.layout import Layout
from autotune.models import compute, cost
from autotune.models import memory as mem
from autotune.models.flops import layer_forward_flops, model_flops_per_step
from autotune.trial import TrialSpec

# h = 64, f = 96 (1.5 h: not the 4 h that the GELU formulas are usually written for).
G = ModelConfig(n_layer=4, hidden=64, n_head=4, seq_len=32, vocab_size=100, ffn_hidden=96,
                mlp="swiglu")
GELU = replace(G, mlp="gelu")


def lay(**kw) -> Layout:
    base = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2, "grad_accum": 4}
    return Layout(**{**base, **kw})


def test_config_field_validation_and_spec_round_trip() -> None:
    assert all(m.mlp == "gelu" for m in MODEL_PRESETS.values())
    with pytest.raises(SpecError, match=r"model\.mlp: got 'geglu'; allowed: one of 'gelu', "
                                        r"'swiglu'"):
        replace(G, mlp="geglu")
    assert G.to_dict()["mlp"] == "swiglu"
    assert ModelConfig.from_dict(G.to_dict()) == G
    assert ModelConfig.from_dict({"preset": "tiny", "mlp": "swiglu"}).mlp == "swiglu"
    spec = TrialSpec.from_dict({"model": G.to_dict(),
                                "layout": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1,
                                           "grad_accum": 1},
                                "run": {}})
    assert spec.model.mlp == "swiglu"


def test_n_params_three_bias_free_matrices() -> None:
    h, f = 64, 96
    per_layer = (h * 3 * h + 3 * h) + (h * h + h) + 3 * h * f + 4 * h  # = 35328
    total = 4 * per_layer + 100 * h + 32 * h + 2 * h + 100 * h
    assert G.n_params() == total == 156288
    # GELU: 2 matrices with biases f and h
    assert GELU.n_params() - G.n_params() == 4 * (f + h - h * f)


def test_layer_forward_flops_three_matmuls() -> None:
    s, h, f = 32, 64, 96
    # per token QKV 2h(3h) + proj 2h^2 + MLP 3 * 2hf; per sequence 4 s^2 h
    per_token = 2 * h * 3 * h + 2 * h * h + 3 * 2 * h * f  # = 69632
    assert layer_forward_flops(G, 1) == s * per_token + 4 * s * s * h == 2490368
    assert layer_forward_flops(G, 3) - layer_forward_flops(GELU, 3) == 3 * s * 2 * h * f
    assert model_flops_per_step(G, 3) == 3 * (4 * layer_forward_flops(G, 3) + 2 * 3 * s * h * 100)


def test_layer_params_per_rank_gate_up_column_down_row() -> None:
    h, f = 64, 96
    # QKV /t, proj /t + bias, gate and up /t, down /t (no bias), LayerNorms
    assert mem.layer_params_per_rank(G, 2) == (
        (h * 3 * h + 3 * h) // 2 + h * h // 2 + h + 2 * h * f // 2 + f * h // 2 + 4 * h
    ) == 17824
    assert mem.params_per_rank(G, lay(), "only") == G.n_params()


def test_activations_store_four_ffn_tensors() -> None:
    s, b, h, f, t = 32, 2, 64, 96, 2
    g, gelu = replace(G, dropout=0.1), replace(GELU, dropout=0.1)  # Korthikanti's setting
    # 16-bit, flash: s b h (10 + 8/t) + 2 bytes x {gate, up, silu(gate), product} of s b f/t
    expected = s * b * h * (10 + 8 / t) + 2 * 4 * s * b * f / t  # = 81920
    assert mem.layer_activation_bytes(g, lay(tp=t), "bf16") == int(expected) == 81920
    # GELU keeps two (GELU input, down input): 4 s b f / t; at f = 4h that is Korthikanti's 16
    assert mem.layer_activation_bytes(gelu, lay(tp=t), "bf16") == int(
        s * b * h * (10 + 8 / t) + 2 * 2 * s * b * f / t) == 69632
    assert mem.layer_activation_bytes(g, lay(tp=t), "fp32") == 2 * 81920
    # without dropout the two 1-byte hidden-dropout masks (2 s b h) are not stored
    assert mem.layer_activation_bytes(G, lay(tp=t), "bf16") == 81920 - 2 * s * b * h


def test_cost_layer_time_adds_one_gemm_and_the_gating_traffic() -> None:
    m = ModelConfig(n_layer=8, hidden=1024, n_head=16, seq_len=1024, ffn_hidden=2816,
                    mlp="swiglu")
    layout = Layout(tp=2, pp=1, dp=4, micro_batch=2, grad_accum=1)
    perf, peak = get_device("a100-80gb"), 312e12
    tokens, h, f, t = 2 * 1024, 1024, 2816, 2

    def fwd(model: ModelConfig) -> float:
        return compute.layer_forward_time_s(model, layout, peak, perf, "bf16")

    # one more 2 h f / t GEMM; SiLU + product read/write 5 f/t per token where bias+GELU
    # reads/writes 2 f/t (2 bytes each); one more element-wise kernel
    extra = (compute.shaped_gemm_time_s(tokens, f // t, h, peak, perf)
             + tokens * 3 * f / t * 2 / (perf.hbm_gbps * 1e9) + perf.kernel_overhead_s)
    assert math.isclose(fwd(m) - fwd(replace(m, mlp="gelu")), extra, rel_tol=1e-9)
    cluster_est = cost.estimate_step(m, layout, _a100())
    assert cluster_est.step_time_s > cost.estimate_step(replace(m, mlp="gelu"), layout,
                                                        _a100()).step_time_s


def _a100():
    from autotune.config.cluster import ClusterConfig

    return ClusterConfig(nodes=1, devices_per_node=8, device="a100-80gb")
