"""Device and host time of one transformer layer's compute for one micro-batch on one TP
rank: GEMMs at their size's efficiency, the attention core, element-wise kernels, what
recompute repeats, the host's dispatch and how much of it the device hides, the output
layer and the optimizer step. Part of the analytic step time of :mod:`autotune.models.cost`;
constants are physical (the device's entry in :data:`autotune.hardware.HARDWARE`).
"""

from __future__ import annotations

import math

from autotune.config.model import ModelConfig
from autotune.hardware import DeviceSpec
from autotune.layout import Layout
from autotune.models.memory import dtype_bytes
from autotune.models.zero_variants import zero_partition_size

__all__ = [
    "GEMM_RAMP_S",
    "HOST_SERIAL_FRACTION",
    "attention_core_time_s",
    "FLASH_BACKWARD_FACTOR",
    "GEMM_TILES",
    "flash_backward_extra_s",
    "flash_forward_time_s",
    "batched_gemm_time_s",
    "shaped_gemm_time_s",
    "wave_efficiency",
    "gemm_efficiency",
    "gemm_time_s",
    "host_exposed_time_s",
    "host_layer_time_s",
    "layer_forward_time_s",
    "logits_forward_time_s",
    "optimizer_time_s",
    "recompute_time_s",
    "tp_collectives_per_layer",
]


GEMM_RAMP_S = 5e-6
"""A GEMM reaches ``gemm_efficiency_max`` only when its ideal time is long against the
launch, the fill of the first wave and the tail of the last (a few microseconds)."""


def gemm_efficiency(flops: float, peak_flops: float, spec: DeviceSpec) -> float:
    """Fraction of peak one GEMM of ``flops`` reaches: rising with the work per kernel.

    ``e(w) = e_max * w / (w + w_half)`` with ``w_half = peak * e_max * GEMM_RAMP_S``: the
    same as a kernel that runs at ``e_max`` after a fixed ramp of ``GEMM_RAMP_S``. Small
    GEMMs (small micro-batch, sequence or hidden / tp) cannot fill the device's compute
    units (wave quantization; NVIDIA, "Matrix Multiplication Background User's Guide").
    """
    w_half = peak_flops * spec.gemm_efficiency_max * GEMM_RAMP_S
    return spec.gemm_efficiency_max * flops / (flops + w_half)


def gemm_time_s(flops: float, peak_flops: float, spec: DeviceSpec) -> float:
    """Time of one GEMM: ``flops / (peak * gemm_efficiency(flops))``."""
    if flops <= 0:
        return 0.0
    return flops / (peak_flops * gemm_efficiency(flops, peak_flops, spec))


GEMM_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64),
                                          (64, 128), (64, 64))
"""Output-tile shapes (rows x columns) the GEMM library chooses among: CUTLASS's and
cuBLAS's common threadblock tiles for 16-bit tensor-core GEMMs (NVIDIA, "Matrix
Multiplication Background User's Guide", "Tile quantization" and "Wave quantization":
256x128 is the guide's worked example on the A100)."""


def wave_efficiency(m: int, n: int, spec: DeviceSpec, batch: int = 1) -> float:
    """Fraction of the device's compute units busy, averaged over a GEMM's waves: an
    ``m x n`` output of ``t`` tiles on ``u`` units runs ``ceil(t / u)`` waves, the last one
    partly idle, so ``t / (ceil(t / u) u)`` (wave quantization, NVIDIA's guide above: 108
    SMs on an A100, so a GEMM of 109 tiles takes two waves). The library is taken to pick
    the tile of :data:`GEMM_TILES` that fills the device best (its heuristics weigh this
    with each tile's own efficiency, which :func:`gemm_efficiency`'s ramp prices); partial
    tiles at the edges count as whole ones (tile quantization). 1 where the device's units
    are not modelled (``spec.gemm_units`` is ``None``)."""
    units = spec.gemm_units
    if not units or m <= 0 or n <= 0:
        return 1.0
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        useful = batch * m * n / (tm * tn)  # whole tiles' worth of real output
        best = max(best, useful / (math.ceil(tiles / units) * units))
    return min(1.0, best)


def shaped_gemm_time_s(m: int, n: int, k: int, peak_flops: float, spec: DeviceSpec) -> float:
    """Time of one ``(m x k) @ (k x n)`` GEMM: :func:`gemm_time_s` of its FLOPs over its
    :func:`wave_efficiency`. The backward's two GEMMs of a linear layer (input and weight
    gradients) are priced at the forward's shape (``3x`` the forward, as elsewhere)."""
    return gemm_time_s(2.0 * m * n * k, peak_flops, spec) / wave_efficiency(m, n, spec)


def batched_gemm_time_s(batch: int, m: int, n: int, k: int, peak_flops: float,
                        spec: DeviceSpec, dtype: str) -> float:
    """Time of ``batch`` GEMMs of ``(m x k) @ (k x n)`` in one batched kernel: the compute
    time at :func:`gemm_efficiency` of the kernel's work, or, where longer, the time to
    read both operands and write the result from HBM once each (the roofline: a kernel's
    time is at least its bytes over the memory bandwidth; Williams, Waterman and Patterson
    2009, "Roofline", CACM 52(4)). A GEMM's arithmetic intensity is
    ``2 m n k / (bytes (m k + k n + m n))``: for the attention scores, ``Q K^T`` per head
    (``m = n = s``, ``k = h / a``) and ``P V`` (``m = s``, ``n = h / a``, ``k = s``), it is
    about ``h / a`` FLOP per 16-bit element, 64-128 in GPT models, at or below the ridge
    of an A100 (312 TFLOPS / 2.0 TB/s = 153 FLOP/B): those GEMMs are bound by memory,
    which one large GEMM of the same FLOPs is not (NVIDIA, "Matrix Multiplication
    Background User's Guide", section "Math and memory bounds")."""
    flops = 2.0 * batch * m * n * k
    if flops <= 0:
        return 0.0
    moved = batch * (m * k + k * n + m * n) * dtype_bytes(dtype)
    compute = gemm_time_s(flops, peak_flops, spec) / wave_efficiency(m, n, spec, batch)
    return max(compute, moved / (spec.hbm_gbps * 1e9))


def layer_forward_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                         spec: DeviceSpec, dtype: str) -> float:
    """Forward time of one transformer layer for one micro-batch on one TP rank.

    GEMMs (per token: QKV ``2h(h+2kv)/t``, projection ``2h^2/t``, MLP ``2hf/t`` per
    matrix: up and down for GELU, gate, up and down for SwiGLU: :mod:`autotune.models.flops`),
    each timed by its shape (:func:`shaped_gemm_time_s`: :func:`gemm_efficiency` and
    :func:`wave_efficiency`); the attention core
    (:func:`attention_core_time_s`); plus the memory-bound element-wise kernels
    (LayerNorm, bias+dropout+residual: ``11`` tensors of ``s b h``, ``s b h / t`` each with
    sequence parallelism, which runs them on a sequence shard (Korthikanti et al. 2022,
    section 4.2.2); bias+GeLU reads and writes ``f/t`` per token, ``8/t`` of ``s b h`` at
    ``f = 4h``; SwiGLU's SiLU reads and writes ``f/t``, its product reads ``2f/t`` and
    writes ``f/t``: one more kernel).
    """
    b, s, h, f, t = layout.micro_batch, model.seq_len, model.hidden, model.ffn, layout.tp
    tokens = b * s
    # (m, n, k) of each GEMM: QKV and the MLP's up (and gate) column-parallel (n / t), the
    # projection and the MLP's down row-parallel (k / t); Shoeybi et al. 2019, section 3.
    ups = [(tokens, f // t, h)] * (model.mlp_matrices - 1)
    gemms = [(tokens, model.qkv_width // t, h), (tokens, h, h // t), *ups, (tokens, h, f // t)]
    time = sum(shaped_gemm_time_s(m, n, k, peak_flops, spec) for m, n, k in gemms)
    swiglu = model.mlp == "swiglu"
    mlp_elem = (5 if swiglu else 2) * f / t  # per token: elements read + written
    replicated = 11 * h / t if layout.sequence_parallel else 11 * h
    elem_bytes = tokens * (replicated + mlp_elem) * dtype_bytes(dtype)
    n_elementwise = 7 if swiglu else 6
    time += elem_bytes / (spec.hbm_gbps * 1e9) + n_elementwise * spec.kernel_overhead_s
    return time + attention_core_time_s(model, layout, peak_flops, spec, dtype)


def attention_core_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                          spec: DeviceSpec, dtype: str) -> float:
    """Forward time of the attention core, ``softmax(Q K^T) V``, for one micro-batch on
    one TP rank: what selective recompute repeats in the backward (Korthikanti et al.
    2022, section 5). The two attention matmuls ``2*2 s^2 h / t`` (one fused kernel with
    flash attention) and, with ``model.attention == "explicit"``, the score matrix
    written, soft-maxed and dropped out (~5 passes over ``a s^2 b / t`` elements; 3
    without dropout). Explicit attention runs the matmuls as Megatron does, ``b a / t``
    batched GEMMs of inner dimension ``h / a`` each (``torch.baddbmm`` and
    ``torch.bmm`` in ``CoreAttention.forward``, deepspeedai/Megatron-DeepSpeed@4efb479
    ``megatron/model/transformer.py``): :func:`batched_gemm_time_s`."""
    b, s, h, t = layout.micro_batch, model.seq_len, model.hidden, layout.tp
    attn = 4 * b * s * s * h / t
    if model.attention == "flash":
        return flash_forward_time_s(attn, peak_flops, spec)
    heads = max(1, model.n_head // t)
    hd = model.head_dim
    time = (batched_gemm_time_s(b * heads, s, s, hd, peak_flops, spec, dtype)  # Q K^T
            + batched_gemm_time_s(b * heads, s, hd, s, peak_flops, spec, dtype))  # P V
    # scores written, soft-maxed (read, write); dropout reads them, writes output + mask
    passes = 5 if model.dropout > 0 else 3
    elem_bytes = passes * model.n_head * s * s * b / t * dtype_bytes(dtype)
    n_elementwise = 2 if model.dropout > 0 else 1
    return time + elem_bytes / (spec.hbm_gbps * 1e9) + n_elementwise * spec.kernel_overhead_s


FLASH_BACKWARD_FACTOR = 2.5
"""A fused attention kernel's backward over its forward, in FLOPs: it stores no score
matrix, so the backward recomputes ``S = Q K^T`` before ``dV = P^T dO``, ``dP = dO V^T``,
``dQ = dS K`` and ``dK = dS^T Q``: 5 matmuls of ``s^2 d`` against the forward's 2 (Dao et
al. 2022, FlashAttention, Algorithm 4), not the 2x of an ordinary layer."""


def flash_forward_time_s(score_flops: float, peak_flops: float, spec: DeviceSpec) -> float:
    """Forward time of a fused attention kernel whose two matmuls are ``score_flops`` over
    the full ``s x s`` square. Where the device has a published kernel efficiency
    (``spec.flash_efficiency``), the causal kernel skips the blocks above the diagonal
    (FlashAttention-2, section 3.1.1: half the square's FLOPs) and runs at that efficiency;
    elsewhere it is priced as one GEMM of the full square (what the model knows)."""
    if spec.flash_efficiency is None:
        return gemm_time_s(score_flops, peak_flops, spec)
    return 0.5 * score_flops / (peak_flops * spec.flash_efficiency)


def flash_backward_extra_s(model: ModelConfig, layout: Layout, peak_flops: float,
                           spec: DeviceSpec, dtype: str) -> float:
    """What a fused attention kernel's backward costs beyond the 2 forwards charged for
    every layer (:data:`FLASH_BACKWARD_FACTOR` - 2 forwards of the kernel); zero with
    explicit attention, whose backward is ordinary GEMMs."""
    if model.attention != "flash":
        return 0.0
    core = attention_core_time_s(model, layout, peak_flops, spec, dtype)
    return (FLASH_BACKWARD_FACTOR - 2.0) * core


def recompute_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                     spec: DeviceSpec, dtype: str) -> float:
    """What the layout's recompute adds to one layer and micro-batch: a whole layer
    forward with ``full`` (Chen et al. 2016), the attention core with ``selective``
    (:func:`attention_core_time_s`), nothing with ``none``."""
    if layout.recompute == "full":
        return layer_forward_time_s(model, layout, peak_flops, spec, dtype)
    if layout.recompute == "selective":
        return attention_core_time_s(model, layout, peak_flops, spec, dtype)
    return 0.0


HOST_OPS_PER_LAYER_PASS = 50
"""Framework operators the host dispatches per transformer layer and pass (LayerNorms,
linears, views and transposes, softmax, dropout, bias-adds, TP region copies)."""


HOST_SERIAL_FRACTION = 0.25
"""Share of the shorter of host and device time that does not overlap when the two are
balanced (see :func:`host_exposed_time_s`): a quarter, i.e. mostly asynchronous."""


def host_layer_time_s(layout: Layout, spec: DeviceSpec) -> float:
    """Host (Python + dispatcher) time of one layer for one micro-batch, all passes.

    Eager PyTorch spends ~10-20 us of CPU per operator (He, "Making Deep Learning Go
    Brrrr From First Principles", 2022: overhead-bound regime); the device runs
    asynchronously, so a layer takes at least this long however small its kernels.
    Each TP collective adds one more synchronising call.
    """
    passes = 4 if layout.recompute == "full" else 3
    ops = passes * HOST_OPS_PER_LAYER_PASS
    if layout.recompute == "selective":
        ops += SELECTIVE_RECOMPUTE_OPS
    if layout.tp > 1:
        ops += tp_collectives_per_layer(layout)
    return ops * spec.host_op_s


SELECTIVE_RECOMPUTE_OPS = 8
"""Operators of the attention core recomputed under selective recompute (views, two
matmuls, scale, mask, softmax; the checkpoint's own bookkeeping)."""


def tp_collectives_per_layer(layout: Layout) -> int:
    """TP collective calls of one layer and micro-batch: 4 all-reduces (2 forward, 2
    backward; Shoeybi et al. 2019, fig. 4), 2 more with the full recompute forward. With
    sequence parallelism each becomes an all-gather or a reduce-scatter, and the backward
    gathers the two column-parallel linears' inputs again (they are stored as sequence
    shards; Korthikanti et al. 2022, section 4.2.2): 2 more."""
    count = 6 if layout.recompute == "full" else 4
    return count + (2 if layout.sequence_parallel else 0)


def host_exposed_time_s(device_s: float, host_s: float, *,
                        serial_fraction: float = HOST_SERIAL_FRACTION) -> float:
    """Host time not hidden behind the device for one layer and micro-batch.

    The host enqueues kernels ahead of the device (CUDA streams are asynchronous), so
    host and device form a two-stage tandem: when one side is much slower it sets the
    pace and the other is hidden entirely, ``max(device, host)``; this is the
    overhead-bound regime of He (2022), where the time per micro-batch does not depend on
    the kernels' size (vTrain: tp = 4, h = 2048 takes the same time per micro-batch at
    micro-batch 1 and 2). Overlap is lost when neither side dominates: the per-operator
    costs alternate (a long GEMM, then a run of short element-wise kernels, a collective),
    so each side is in turn the bottleneck and the other waits. The exposed part is
    charged as ``serial_fraction * min * (min / max)``: ``HOST_SERIAL_FRACTION`` of the
    shorter side when the two are equal, vanishing as one side dominates. (Before: a
    constant quarter of the shorter side, which charged up to a quarter of the device time
    to overhead-bound layouts whose device work is fully hidden.) Returns the time beyond
    ``device_s``.
    """
    longer, shorter = max(device_s, host_s), min(device_s, host_s)
    if longer <= 0:
        return 0.0
    layer = longer + serial_fraction * shorter * (shorter / longer)
    return layer - device_s


def logits_forward_time_s(model: ModelConfig, layout: Layout, peak_flops: float,
                          spec: DeviceSpec) -> float:
    """Forward time of the vocabulary-parallel output layer and the fp32 softmax/loss
    (``2 b s h V / t`` FLOPs; the logits read and written in fp32 about 3 times)."""
    b, s, t = layout.micro_batch, model.seq_len, layout.tp
    vocab = math.ceil(model.vocab_size / t)
    gemm = gemm_time_s(2 * b * s * model.hidden * vocab, peak_flops, spec)
    return gemm + 3 * b * s * vocab * 4 / (spec.hbm_gbps * 1e9) + 4 * spec.kernel_overhead_s


def optimizer_time_s(n_params: int, layout: Layout, spec: DeviceSpec, dtype: str) -> float:
    """Adam step over the rank's shard: memory-bound, ~28-30 bytes read or written per
    parameter (fp32 master, momentum, variance read and written; gradient read; 16-bit
    weight written). ZeRO-1 and above update only ``1/dp`` of the parameters."""
    shard = n_params / zero_partition_size(layout) if layout.zero_stage >= 1 else n_params
    per_param = 28 if dtype == "fp32" else 30
    return shard * per_param / (spec.hbm_gbps * 1e9)
