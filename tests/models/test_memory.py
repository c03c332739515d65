"""Each memory term against a hand computation (small numbers, written out)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autotune.config.model import ModelConfig
from autotune.hardware import DEFAULT_RUNTIME_BYTES, HARDWARE, MiB
from autotune.layout import Layout
from autotune.models import memory as mem

M = ModelConfig(n_layer=4, hidden=64, n_head=4, seq_len=32, vocab_size=100, ffn_hidden=256)


def lay(**kw) -> Layout:
    base = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2, "grad_accum": 4}
    return Layout(**{**base, **kw})


def test_layer_params_tp_split() -> None:
    h, f = 64, 256
    full = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
    assert mem.layer_params_per_rank(M, 1) == full
    t = 2
    split = (h * 3 * h + 3 * h) // t + h * h // t + h + (h * f + f) // t + f * h // t + h + 4 * h
    assert mem.layer_params_per_rank(M, t) == split


def test_params_per_rank_stages_hold_embeddings_and_output() -> None:
    per = mem.layer_params_per_rank(M, 1)
    only = mem.params_per_rank(M, lay(), "only")
    assert only == M.n_params()  # untied embeddings, as the trainer
    first = mem.params_per_rank(M, lay(pp=2), "first")
    last = mem.params_per_rank(M, lay(pp=2), "last")
    assert first == 2 * per + 100 * 64 + 32 * 64
    assert last == 2 * per + 100 * 64 + 2 * 64
    # vocabulary-parallel: ceil(100 / 3) rows per TP rank (the trainer pads V)
    assert mem.params_per_rank(M, lay(tp=4), "last") == (
        4 * mem.layer_params_per_rank(M, 4) + 25 * 64 + 2 * 64)


@pytest.mark.parametrize(("dtype", "zero", "dp", "expected"), [
    ("fp32", 0, 4, (4000, 4000, 8000)),
    ("fp32", 1, 4, (4000, 4000, 2000)),
    ("fp32", 2, 4, (4000, 1000, 2000)),
    ("fp32", 3, 4, (1000, 1000, 2000)),
    ("fp16", 0, 2, (2000, 2000, 12000)),   # Rajbhandari et al.: 2 + 2 + 12
    ("fp16", 3, 2, (1000, 1000, 6000)),
    ("bf16", 1, 2, (2000, 6000, 6000)),    # DeepSpeed BF16_Optimizer: fp32 grad buffer
    ("bf16", 2, 2, (2000, 1000, 6000)),
])
def test_model_states_by_zero_stage(dtype, zero, dp, expected) -> None:
    assert mem.model_state_bytes(1000, lay(dp=dp, zero_stage=zero), dtype) == expected


def test_layer_activations_korthikanti() -> None:
    DROPPED = replace(M, dropout=0.1)  # the paper's setting: dropout masks are stored
    EXPLICIT = replace(DROPPED, attention="explicit")
    s, b, h, a = 32, 2, 64, 4
    # 16-bit, no TP, explicit attention: s b h (34 + 5 a s / h)
    assert mem.layer_activation_bytes(EXPLICIT, lay(), "bf16") == int(
        s * b * h * (34 + 5 * a * s / h))
    # TP 2: s b h (10 + 24/t + 5 a s / (h t)); flash drops the score term
    t = 2
    assert mem.layer_activation_bytes(EXPLICIT, lay(tp=t), "bf16") == int(
        s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert mem.layer_activation_bytes(DROPPED, lay(tp=t), "bf16") == int(
        s * b * h * (10 + 24 / t))
    assert mem.layer_activation_bytes(DROPPED, lay(), "fp32") == int(2 * s * b * h * 34)
    # Without dropout (the trainer): no masks, no dropped-out scores: 8 + 24/t + 2as/(ht)
    assert mem.layer_activation_bytes(M, lay(tp=t), "bf16") == int(s * b * h * (8 + 24 / t))
    assert mem.layer_activation_bytes(replace(M, attention="explicit"), lay(tp=t), "bf16") \
        == int(s * b * h * (8 + 24 / t + 2 * a * s / (h * t)))


def test_activations_in_flight_and_recompute() -> None:
    one = mem.layer_activation_bytes(M, lay(pp=2), "bf16")
    # 1F1B: the first stage holds min(pp, grad_accum) = 2 micro-batches, the last one 1
    assert mem.activation_bytes(M, lay(pp=2), "bf16", "first") == 2 * 2 * one
    assert mem.activation_bytes(M, lay(pp=2), "bf16", "last") == 2 * 1 * one
    assert mem.activation_bytes(M, lay(pp=4, grad_accum=2), "bf16", "first") == 1 * 2 * one
    # full recompute: 2 s b h per layer and micro-batch in flight + one layer's working set
    rc = lay(pp=2, recompute="full")
    assert mem.activation_bytes(M, rc, "bf16", "first") == 2 * 2 * (2 * 32 * 2 * 64) + one


def test_logits_fp32_copy_and_tp() -> None:
    assert mem.logits_bytes(M, lay(), "bf16") == 32 * 2 * 100 * (2 + 4)
    assert mem.logits_bytes(M, lay(tp=4), "fp32") == 32 * 2 * 25 * (4 + 4)


def test_buffers_runtime_and_peak_is_the_sum() -> None:
    n = mem.params_per_rank(M, lay(), "only")
    assert mem.buffer_bytes(M, lay(), "bf16", n) == 2 * n
    assert mem.buffer_bytes(M, lay(dp=2), "bf16", n) == 4 * n
    z3 = mem.buffer_bytes(M, lay(dp=2, zero_stage=3), "bf16", n)
    assert z3 == 4 * n + 2 * mem.layer_params_per_rank(M, 1) * 2
    assert mem.runtime_bytes("cpu") == HARDWARE["cpu"].runtime_bytes == 420 * MiB
    assert (mem.runtime_bytes("h100") == mem.runtime_bytes(None) == HARDWARE["h100"].runtime_bytes
            == DEFAULT_RUNTIME_BYTES == 1536 * MiB)
    est = mem.estimate_memory(M, lay(pp=2), dtype="bf16", device="h100")
    terms = (est.weights_bytes + est.grads_bytes + est.optimizer_bytes + est.activations_bytes
             + est.logits_bytes + est.buffers_bytes + est.runtime_bytes)
    assert est.peak_bytes == terms == max(est.stage_peak_bytes)
    assert len(est.stage_peak_bytes) == 2 and est.stage in ("first", "last")


def test_more_sharding_never_needs_more_memory() -> None:
    big = ModelConfig(n_layer=24, hidden=2048, n_head=16, seq_len=2048)
    peaks = [mem.estimate_memory(big, lay(dp=8, zero_stage=z)).peak_bytes for z in (0, 1, 2, 3)]
    assert peaks == sorted(peaks, reverse=True)
    by_tp = [mem.estimate_memory(big, lay(tp=t)).peak_bytes for t in (1, 2, 4, 8)]
    assert by_tp == sorted(by_tp, reverse=True)
    assert math.isclose(mem.estimate_memory(big, lay(recompute="full")).activations_bytes,
                        24 * (2048 * 2 * 2048) * 2 + mem.layer_activation_bytes(big, lay(),
                                                                                  "bf16"))


def test_bf16_pipeline_without_zero_shards_the_fp32_states() -> None:
    # DeepSpeed runs bf16 + pipeline + ZeRO-0 through BF16_Optimizer, which keeps this
    # rank's 1/dp of the fp32 master weights and Adam states (engine.py
    # _do_optimizer_sanity_check; bf16_optimizer.py fp32_groups_flat_partition).
    assert mem.model_state_bytes(1000, lay(dp=2, pp=2), "bf16") == (2000, 6000, 6000)
    # Without a pipeline it is DDP_BFLOAT16 (FP16_Optimizer): unsharded; fp16 likewise.
    assert mem.model_state_bytes(1000, lay(dp=2), "bf16") == (2000, 6000, 12000)
    assert mem.model_state_bytes(1000, lay(dp=2, pp=2), "fp16") == (2000, 2000, 12000)
