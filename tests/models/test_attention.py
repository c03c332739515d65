"""``model.attention``: the config field, and what it changes in the memory and cost models."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS, ModelConfig
from autotune.errors import SpecError
from autotune.hardware import get_device
from autotune.landscape import load_landscape
from autotune.layout import Layout
from autotune.models import compute, cost
from autotune.models import memory as mem

M = ModelConfig(n_layer=4, hidden=2048, n_head=16, seq_len=1024, ffn_hidden=8192)
LAY = Layout(tp=2, pp=1, dp=1, micro_batch=2, grad_accum=2, recompute="none")


def test_field_default_validation_and_round_trip() -> None:
    assert all(m.attention == "flash" for m in MODEL_PRESETS.values())
    with pytest.raises(SpecError, match=r"model\.attention: got 'sparse'; allowed: one of "
                                        r"'flash', 'explicit'"):
        replace(M, attention="sparse")
    explicit = replace(M, attention="explicit")
    assert ModelConfig.from_dict(explicit.to_dict()) == explicit
    assert ModelConfig.from_dict({"preset": "tiny", "attention": "explicit"}).attention \
        == "explicit"


def test_explicit_attention_stores_the_score_matrix() -> None:
    s, b, a, t, h = 1024, 2, 16, 2, 2048

    def extra(dropout: float) -> int:
        base = replace(M, dropout=dropout)
        return (mem.layer_activation_bytes(replace(base, attention="explicit"), LAY, "bf16")
                - mem.layer_activation_bytes(base, LAY, "bf16"))

    # Korthikanti: 5as/h of sbh with dropout (softmax output 2, dropout mask 1 and output 2)
    assert extra(0.1) == pytest.approx(5 * a * s * s * b / t, abs=1)
    assert extra(0.0) == pytest.approx(2 * a * s * s * b / t, abs=1)  # the softmax output
    # without dropout the two replicated hidden-dropout masks go too: 10 -> 8 of sbh
    assert (mem.layer_activation_bytes(replace(M, dropout=0.1), LAY, "bf16")
            - mem.layer_activation_bytes(M, LAY, "bf16")) == pytest.approx(2 * s * b * h, abs=1)
    explicit = replace(M, attention="explicit")
    assert mem.estimate_memory(explicit, LAY).peak_bytes > mem.estimate_memory(M, LAY).peak_bytes


def test_explicit_attention_costs_score_passes_and_two_gemms() -> None:
    perf, peak = get_device("a100-80gb"), 312e12
    dropped = replace(M, dropout=0.1)  # Megatron's default: the 5 passes of the docstring
    flash = compute.layer_forward_time_s(dropped, LAY, peak, perf, "bf16")
    explicit = compute.layer_forward_time_s(replace(dropped, attention="explicit"), LAY, peak,
                                         perf, "bf16")
    s, b, a, t = 1024, 2, 16, 2
    attn = 4 * b * s * s * 2048 / t
    hd, heads = 2048 // a, a // t  # Megatron's b * a / t batched GEMMs of inner dim h / a
    expected = (compute.batched_gemm_time_s(b * heads, s, s, hd, peak, perf, "bf16")
                + compute.batched_gemm_time_s(b * heads, s, hd, s, peak, perf, "bf16")
                - compute.flash_forward_time_s(attn, peak, perf)
                + 5 * a * s * s * b / t * 2 / (perf.hbm_gbps * 1e9)
                + 2 * perf.kernel_overhead_s)
    assert explicit - flash == pytest.approx(expected, rel=1e-9)
    cluster = ClusterConfig(devices_per_node=2, device="a100-80gb")
    assert (cost.estimate_step(replace(M, attention="explicit"), LAY, cluster).step_time_s
            > cost.estimate_step(M, LAY, cluster).step_time_s)


def test_landscape_formats_set_the_attention_their_runs_used() -> None:
    vtrain = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
              "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
              "iteration time (ms)\n2,8,1,1024,16,24,1024,1,2,1,500\n")
    [g] = load_landscape(io.StringIO(vtrain))
    assert g.model.attention == "explicit"  # Megatron's fused softmax, 2022-23
    [g] = load_landscape(io.StringIO(vtrain), attention="flash")
    assert g.model.attention == "flash"
    with pytest.raises(SpecError, match="attention: got 'fused'"):
        load_landscape(io.StringIO(vtrain), attention="fused")


def test_dropout_is_validated_and_allowed_for_every_launcher(tmp_path) -> None:
    from autotune.spec import parse_study

    with pytest.raises(SpecError, match=r"model\.dropout: got 1\.0; allowed: a probability"):
        replace(M, dropout=1.0)
    with pytest.raises(SpecError, match=r"model\.dropout: got -0\.1"):
        replace(M, dropout=-0.1)
    study = {"model": {"preset": "tiny", "dropout": 0.1}, "cluster": {"device": "cpu"},
             "training": {"global_batch": 4, "dtype": "fp32"}}
    assert parse_study(study).model.dropout == 0.1  # the built-in trainer runs it
    csv = tmp_path / "t.csv"
    csv.write_text("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
                   "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
                   "iteration time (ms)\n1,4,1,64,4,4,64,1,1,1,10\n")
    replayed = parse_study({**study, "launcher": {"kind": "replay",
                                                  "replay": {"landscape": str(csv)}}})
    assert replayed.model.dropout == 0.1  # describing measured runs is fine


def test_explicit_attention_matmuls_are_batched_small_gemms() -> None:
    """``b a / t`` GEMMs of inner dimension ``h / a``: at ``h / a = 64`` on an A100 the
    scores' GEMM moves more bytes than its FLOPs take at the large-GEMM rate (roofline),
    so it takes longer than one GEMM of the same FLOPs; at a large inner dimension it
    does not."""
    from autotune.hardware import get_device
    from autotune.models.compute import batched_gemm_time_s, gemm_time_s

    spec = get_device("a100-80gb")
    peak = spec.peak_flops_or_fallback("bf16")
    s, hd, batch = 2048, 64, 32
    small = batched_gemm_time_s(batch, s, s, hd, peak, spec, "bf16")
    flops = 2.0 * batch * s * s * hd
    assert small > 1.2 * gemm_time_s(flops, peak, spec)
    assert small == pytest.approx(batch * (2 * s * hd + s * s) * 2 / (spec.hbm_gbps * 1e9))
    from autotune.models.compute import wave_efficiency

    big = batched_gemm_time_s(1, 8192, 8192, 8192, peak, spec, "bf16")
    waves = wave_efficiency(8192, 8192, spec)  # 2,048 tiles on 108 SMs: 19 waves, ~full
    assert waves > 0.99
    assert big == pytest.approx(gemm_time_s(2.0 * 8192**3, peak, spec) / waves)


def test_wave_quantization_by_shape() -> None:
    """An A100 has 108 SMs: an output of exactly 108 256x128 tiles fills one wave; one of
    109 such tiles would leave the second wave almost empty, unless another tile shape of
    the library fills the device better (it picks the best of GEMM_TILES)."""
    from autotune.hardware import get_device
    from autotune.models.compute import shaped_gemm_time_s, wave_efficiency

    a100 = get_device("a100-80gb")
    assert wave_efficiency(256 * 12, 128 * 9, a100) == pytest.approx(1.0)
    # 4 x 27 = 108 tiles of 128x128 (or 216 of 128x64): a full wave either way.
    assert wave_efficiency(512, 128 * 27, a100) == pytest.approx(1.0)
    # 96 of 108 SMs busy whatever the tile (12 x 8 of 128x128, 6 x 16 of 256x64 ...).
    odd = wave_efficiency(1536, 1024, a100)
    assert 0.85 < odd < 1.0
    assert wave_efficiency(1536, 1024, get_device("max1550-tile")) == 1.0  # not modelled
    peak = a100.peak_flops_or_fallback("bf16")
    assert shaped_gemm_time_s(1536, 1024, 4096, peak, a100) == pytest.approx(
        compute.gemm_time_s(2.0 * 1536 * 1024 * 4096, peak, a100) / odd)


def test_flash_attention_backward_recomputes_and_a_published_kernel_skips_the_mask() -> None:
    from autotune.hardware import get_device
    from autotune.models.compute import (
        FLASH_BACKWARD_FACTOR,
        attention_core_time_s,
        flash_backward_extra_s,
    )
    from autotune.models.profile_blend import analytic_layer

    a100, tile = get_device("a100-80gb"), get_device("max1550-tile")
    peak = a100.peak_flops_or_fallback("bf16")
    s, b, t, h = 1024, 2, 2, 2048
    score = 4 * b * s * s * h / t
    core = attention_core_time_s(M, LAY, peak, a100, "bf16")
    assert core == pytest.approx(0.5 * score / (peak * 0.50))  # FlashAttention-2 on an A100
    tile_peak = tile.peak_flops_or_fallback("bf16")  # no published figure: the full square
    assert attention_core_time_s(M, LAY, tile_peak, tile, "bf16") == pytest.approx(
        compute.gemm_time_s(score, tile_peak, tile))
    assert FLASH_BACKWARD_FACTOR == 2.5
    assert flash_backward_extra_s(M, LAY, peak, a100, "bf16") == pytest.approx(0.5 * core)
    assert flash_backward_extra_s(replace(M, attention="explicit"), LAY, peak, a100,
                                  "bf16") == 0.0
    cluster = ClusterConfig(devices_per_node=2, device="a100-80gb")
    layer = analytic_layer(M, LAY, cluster)
    fwd = compute.layer_forward_time_s(M, LAY, peak, a100, "bf16")
    assert layer.compute_s == pytest.approx(3 * fwd + 0.5 * core)
