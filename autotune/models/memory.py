"""Peak memory per device of one training step: one documented function per term.

The estimate is the sum, on the worst pipeline stage, of

* model states (weights, gradients, Adam states) of the parameters that stage holds,
  sharded by ZeRO over ``dp`` (:func:`model_state_bytes`, Rajbhandari et al. 2020);
* stored activations of the micro-batches in flight (:func:`layer_activation_bytes`,
  Korthikanti et al. 2022, eq. 1-2; 1F1B in-flight count, Narayanan et al. 2021);
* the output layer's tensors at the end of the forward pass on the last stage
  (:func:`output_layer_bytes`), beyond one layer's working set, with which they never
  coexist (:func:`one_layer_working_bytes`);
* communication buffers (:func:`buffer_bytes`) and a fixed runtime allowance
  (:func:`runtime_bytes`).

Where a measured layer profile (``profile=``, :mod:`autotune.models.profile`) holds the
layout's layer shape with its bytes, the stored activations per layer and micro-batch are
the measured ones (:func:`measured_layer_activation`) instead of Korthikanti et al.'s
count; every other term stays analytic.

Only the first and the last stage can be the worst one: the first holds the most
micro-batches in flight (``pp`` of them under 1F1B) and the embeddings, the last one the
output layer and the logits; every middle stage holds fewer activations than the first.
With ``pp = 1`` the two coincide. See ``docs/models.md`` for the derivations.

>>> from autotune.config.model import MODEL_PRESETS
>>> from autotune.layout import Layout
>>> est = estimate_memory(MODEL_PRESETS["gpt-1.3b"], Layout(tp=1, pp=1, dp=8, micro_batch=1,
...                       grad_accum=1, zero_stage=1, recompute="full"), dtype="bf16")
>>> est.stage, round(est.peak_bytes / 2**30, 1)
('only', 17.4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.config.model import ModelConfig
from autotune.hardware import DEFAULT_RUNTIME_BYTES, HARDWARE
from autotune.layout import Layout
from autotune.models import stacks
from autotune.models.activations import (
    activation_bytes,
    attention_score_bytes,
    dtype_bytes,
    layer_activation_bytes,
    logits_bytes,
    one_layer_working_bytes,
    output_layer_bytes,
    score_transient_bytes,
    stage_layers,
    stored_layer_bytes,
    stored_layers,
)
from autotune.models.ulysses import ulysses_share
from autotune.models.zero_variants import hpz_secondary_bytes, zero_partition_size

if TYPE_CHECKING:  # only its lookup is called: the models stay free of the file format
    from autotune.models.profile import LayerProfile

__all__ = [
    "MemoryEstimate",
    "MeasuredActivation",
    "estimate_memory",
    "measured_layer_activation",
    "stored_layer_bytes",
    "layer_state_bytes",
    "peak_retention",
    "params_per_rank",
    "layer_params_per_rank",
    "model_state_bytes",
    "score_transient_bytes",
    "layer_activation_bytes",
    "attention_score_bytes",
    "activation_bytes",
    "logits_bytes",
    "output_layer_bytes",
    "one_layer_working_bytes",
    "buffer_bytes",
    "runtime_bytes",
    "optimizer_temp_bytes",
    "dtype_bytes",
    "CPU_ALLOCATOR_OVERHEAD",
    "COMM_BUCKET_ELEMENTS",
]

CPU_ALLOCATOR_OVERHEAD = 1.15
"""Peak RSS over live bytes on CPU (allocator retention), charged to ``runtime_bytes``."""

COMM_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size``/``allgather_bucket_size`` (5e8 elements)."""


def layer_params_per_rank(model: ModelConfig, tp: int) -> int:
    """Parameters of one transformer layer on one TP rank (see :func:`params_per_rank`)."""
    h, f, t = model.hidden, model.ffn, tp
    qkv = model.qkv_width
    if model.mlp == "swiglu":
        mlp = 2 * h * f // t + f * h // t  # gate and up column-, down row-parallel; no biases
    else:
        mlp = (h * f + f) // t + f * h // t + h  # up column-, down row-parallel (bias replicated)
    return (
        (h * qkv + qkv) // t   # QKV weight + bias, column-parallel
        + h * h // t + h       # attention output, row-parallel; bias replicated
        + mlp
        + 4 * h                # two LayerNorms, replicated
    )


def params_per_rank(model: ModelConfig, layout: Layout, stage: str, *,
                    tied: bool = False) -> int:
    """Parameters one rank of a ``stage`` ("first", "last", "only") holds before ZeRO.

    Megatron tensor parallelism (Shoeybi et al. 2019, section 3) splits the QKV and
    MLP-up weights and biases by columns (``/t``), the attention-output and MLP-down
    weights by rows (``/t``) with their biases replicated, and replicates the LayerNorms.
    A SwiGLU MLP has two column-parallel matrices (gate, up) and one row-parallel (down),
    all without biases (Llama-style; see :class:`~autotune.config.model.ModelConfig`).
    The word embedding and the output layer are vocabulary-parallel (``ceil(V/t)`` rows,
    the trainer pads V); the position embedding is replicated on the first stage.
    ``tied``: the output layer is the word embedding's weight
    (:func:`autotune.models.stacks.ties_embeddings`), one matrix where a rank holds both.
    """
    t, h = layout.tp, model.hidden
    n = stage_layers(model, layout.pp) * layer_params_per_rank(model, t)
    vocab_rows = math.ceil(model.vocab_size / t)
    if stage in ("first", "only"):
        n += vocab_rows * h + model.seq_len * h
    if stage in ("last", "only"):
        n += 2 * h  # final LayerNorm
        if not (tied and stage == "only"):
            n += vocab_rows * h  # the output layer's own matrix
    return n


def model_state_bytes(n_params: int, layout: Layout, dtype: str,
                      grad_accum_dtype: str | None = None) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes of ``n_params`` under ZeRO.

    Rajbhandari et al. 2020 (ZeRO, section 3.1): mixed-precision Adam keeps 2 bytes of
    16-bit weights, 2 of 16-bit gradients and K = 12 of fp32 master weights, momentum
    and variance per parameter (bf16 below ZeRO-2: by DeepSpeed's optimizer wrapper,
    which ``grad_accum_dtype`` picks, :func:`autotune.models.stacks.deepspeed_grad_bytes`;
    ``None``, not known: 2 + 4). fp32 training keeps 4 + 4 and 8 (momentum, variance; the
    weights are their own master copy). Stage 1 shards the optimizer states over ``dp``,
    stage 2 the gradients too, stage 3 the weights too.
    """
    # ZeRO partitions over dp * ulysses, MiCS over its partition group (zero_variants).
    dp, z = zero_partition_size(layout), layout.zero_stage
    w_b, o_b = (4, 8) if dtype == "fp32" else (2, 12)
    g_b: float = 4 if dtype == "fp32" else 2
    if dtype in ("bf16", "fp16") and z <= 1:
        # The wrapper's gradients; in bf16 not known which, BF16_Optimizer's fp32
        # accumulation buffer beside the bf16 ``.grad`` (deepspeed/runtime/bf16_optimizer.py),
        # 2 + 4: the other recipes are in grad_accumulation_sigma_bytes (memory_uncertainty).
        g_b = stacks.deepspeed_grad_bytes(layout, grad_accum_dtype, dtype)
    weights = n_params * w_b / (dp if z >= 3 else 1) + hpz_secondary_bytes(n_params, layout, dtype)
    grads = n_params * g_b / (dp if z >= 2 else 1)
    optim = n_params * o_b / (dp if z >= 1 or _bf16_pipeline_optimizer(layout, dtype) else 1)
    return int(weights), int(grads), int(optim)


def _bf16_pipeline_optimizer(layout: Layout, dtype: str) -> bool:
    """Whether DeepSpeed shards the fp32 states over ``dp`` although ZeRO is off.

    bf16 with a pipeline and ZeRO-0 runs through ``BF16_Optimizer``
    (deepspeed/runtime/engine.py, ``_do_optimizer_sanity_check``: ``model_dtype ==
    grad_accum_dtype == bfloat16 and self.pipeline_parallelism`` returns ``BFLOAT16``;
    deepspeedai/DeepSpeed@007cca6a2ffe3ed9d393459f4a3081bd54341ba6), and that optimizer
    keeps only this rank's ``1/dp`` partition of the fp32 master weights, hence of the
    Adam states (deepspeed/runtime/bf16_optimizer.py, ``fp32_groups_flat_partition``,
    deepspeedai/DeepSpeed@aa3a6393e3161ed13ade8673ea9ea468285eaaa6): ZeRO-1's sharding
    without the name. Without a pipeline bf16 ZeRO-0 is ``DDP_BFLOAT16`` (the unsharded
    ``FP16_Optimizer``); fp16 and fp32 never take this path.
    """
    return dtype == "bf16" and layout.zero_stage == 0 and layout.pp > 1


def buffer_bytes(model: ModelConfig, layout: Layout, dtype: str, n_params: int) -> int:
    """Communication buffers: one gradient bucket (DeepSpeed's default 5e8 elements,
    capped by the rank's parameters), doubled when gradients are all-reduced over
    ``dp > 1`` (the flattened bucket and the collective's copy); with ZeRO-3 also the
    gathered (unsharded) weights of two layers (the one computing, the one prefetched)."""
    bucket = min(n_params, COMM_BUCKET_ELEMENTS) * dtype_bytes(dtype)
    if layout.dp > 1:
        bucket *= 2  # the flattened bucket and the collective's staging copy of it
    if layout.zero_stage >= 3:
        bucket += 2 * layer_params_per_rank(model, layout.tp) * dtype_bytes(dtype)
    return bucket


def optimizer_temp_bytes(n_params: int, layout: Layout) -> int:
    """Temporaries of the optimizer step: torch's multi-tensor AdamW allocates
    ``sqrt(v)`` for every parameter it updates (``torch/optim/adamw.py``,
    ``_multi_tensor_adamw``), 4 bytes each in fp32; ZeRO-1+ updates ``1/dp`` of them."""
    updated = n_params / zero_partition_size(layout) if layout.zero_stage >= 1 else n_params
    return int(4 * updated)


def runtime_bytes(device: str | None) -> int:
    """The fixed runtime allowance of a device-table name
    (:attr:`~autotune.hardware.DeviceSpec.runtime_bytes`); an accelerator's
    (:data:`~autotune.hardware.DEFAULT_RUNTIME_BYTES`) for ``None`` or a name the table
    does not hold."""
    spec = HARDWARE.get(device) if device is not None else None
    return spec.runtime_bytes if spec is not None else DEFAULT_RUNTIME_BYTES


def peak_retention(peak: str) -> float:
    """Measured bytes per live byte of a measured peak: :data:`CPU_ALLOCATOR_OVERHEAD` for
    a peak resident set (``"rss"``, what the model charges on ``cpu``), 1 for an
    allocator's peak allocated bytes (``"allocated"``)."""
    return CPU_ALLOCATOR_OVERHEAD if peak == "rss" else 1.0


def layer_state_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """Model states of one layer on one TP rank as ``autotune profile`` runs it: the
    built-in trainer (its DeepSpeed config accumulates gradients in the model's dtype),
    ``pp = dp = 1``, ZeRO 0 (:func:`model_state_bytes` of :func:`layer_params_per_rank`)."""
    alone = Layout(tp=layout.tp, pp=1, dp=1, micro_batch=layout.micro_batch, grad_accum=1,
                   zero_stage=0, recompute=layout.recompute,
                   sequence_parallel=layout.sequence_parallel)
    return sum(model_state_bytes(layer_params_per_rank(model, layout.tp), alone, dtype,
                                 grad_accum_dtype=dtype))


@dataclass(frozen=True)
class MeasuredActivation:
    """A profile's bytes of one layer, split into the analytic states and the rest."""

    layer_bytes: float
    """Measured: what one more layer adds to the peak (:class:`~autotune.models.profile.
    LayerMemory`), in the measured peak's bytes."""
    state_bytes: int
    """Analytic: its model states at ``pp = dp = 1``, ZeRO 0 (:func:`layer_state_bytes`)."""
    retention: float
    """Measured bytes per live byte (:func:`peak_retention`)."""
    activation_bytes: float
    """Stored activations per layer and micro-batch, live bytes:
    ``layer_bytes / retention - state_bytes``."""
    sigma_bytes: float | None
    """Its standard error (the profile's, over ``retention``); ``None`` if unknown."""

    @property
    def usable(self) -> bool:
        """Positive: a non-positive remainder means the analytic states exceed what the
        stack holds, and the split says nothing about the activations."""
        return self.activation_bytes > 0


def measured_layer_activation(model: ModelConfig, layout: Layout, *, dtype: str,
                              device: str | None, profile: LayerProfile | None,
                              ) -> MeasuredActivation | None:
    """The measured activations of ``layout``'s layer, where ``profile`` has its bytes.

    ``autotune profile`` runs each shape at 1 and 3 layers with ``pp = dp = 1`` and ZeRO
    0: one more layer adds its model states ``S`` (weights, gradients, Adam states of its
    parameters, known analytically from the parameter count) and the activations it
    stores for the one micro-batch in flight ``A``, so the measured slope is ``B = rho (S +
    A)`` with ``rho`` the measured peak's bytes per live byte (:func:`peak_retention`:
    on CPU the resident set also holds the allocator's retention, which the model charges
    as :data:`CPU_ALLOCATOR_OVERHEAD`). Hence ``A = B / rho - S``, with the standard error
    of ``B`` over ``rho``. For the profiled layout itself the model then reproduces the
    measured ``B`` per layer exactly, whatever its states are off by; under ZeRO or a
    pipeline the states are sharded or the micro-batches in flight multiplied, and ``A``
    scales as the analytic term would.

    If the step's peak is the optimizer step rather than the backward (activations smaller
    than the optimizer's temporaries), the slope measures those temporaries and ``A`` is
    an upper bound: conservative. ``None`` without a profile, a device, or an entry with
    bytes for this shape (any TP link).
    """
    if profile is None or device is None:
        return None
    mem = profile.layer_memory(model, layout, device=device, dtype=dtype)
    if mem is None:
        return None
    rho = peak_retention(mem.peak)
    states = layer_state_bytes(model, layout, dtype)
    return MeasuredActivation(
        mem.layer_bytes, states, rho, mem.layer_bytes / rho - states,
        mem.stderr_bytes / rho if mem.stderr_bytes is not None else None)


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-term bytes on the worst stage of one rank, and their sum ``peak_bytes``."""

    stage: str
    """Which stage peaks: ``"first"``, ``"last"`` or ``"only"`` (``pp = 1``)."""
    params_per_rank: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    """What the output layer adds at the end of the forward pass
    (:func:`output_layer_bytes`) beyond one layer's working set, which ``activations_bytes``
    holds and which it never coexists with; zero on stages without the output layer."""
    buffers_bytes: int
    """Communication buckets and optimizer-step temporaries."""
    runtime_bytes: int
    """Runtime allowance (with the CPU allocator's retention on ``cpu``)."""
    peak_bytes: int
    """Sum of the terms above on the worst stage."""
    stage_peak_bytes: tuple[int, ...]
    """Peak of each stage considered (first, last), or one value when ``pp = 1``."""
    profiled: bool = False
    """The stored activations per layer are a layer profile's measured ones
    (:func:`measured_layer_activation`), not the analytic count."""
    grad_accum_dtype: str | None = None
    """DeepSpeed's gradient accumulation dtype the estimate took (``None``: not known; its
    error bar then carries the other recipes)."""
    activations_sigma_bytes: int | None = None
    """sd of the measured part of ``activations_bytes``: the profile's error bar times the
    layer-micro-batches stored (``None``: analytic, or the profile gave no error bar)."""

    @property
    def model_state_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def _stage_estimate(model: ModelConfig, layout: Layout, dtype: str, stage: str,
                    device: str | None, measured: MeasuredActivation | None,
                    stack: str = "deepspeed",
                    grad_accum_dtype: str | None = None) -> MemoryEstimate:
    n = params_per_rank(model, layout, stage, tied=stacks.ties_embeddings(stack))
    w, g, o = (stacks.megatron_state_bytes(n, layout, dtype, stack) if stacks.is_megatron(stack)
               else model_state_bytes(n, layout, dtype, grad_accum_dtype))
    per_layer = measured.activation_bytes if measured is not None else None
    act = activation_bytes(model, layout, dtype, stage, measured_layer_bytes=per_layer)
    act = int(ulysses_share(act, layout))  # each Ulysses rank holds s/u of every sequence
    logit = 0
    if stage in ("last", "only"):
        # The output layer's phase and one layer's working set (part of ``act``) never
        # coexist: the peak adds the larger one, i.e. the output layer only beyond it.
        logit = max(0, int(ulysses_share(output_layer_bytes(model, layout, dtype)
                                         - one_layer_working_bytes(model, layout, dtype),
                                         layout)))
    # The stack's own buffers (autotune.models.stacks): DeepSpeed's buckets, torch AdamW's
    # temporary; Megatron's DDP reduces its fp32 grad buffer (counted in ``g``) in place.
    buf = buffer_bytes(model, layout, dtype, n) if stacks.has_deepspeed_buckets(stack) else 0
    step = int(stacks.step_excess_bytes(layout, dtype, stack, grad_accum_dtype) * n)
    if step:
        # FP16_Optimizer's step (AdamW's temporary included), or Megatron's fp16 one, runs
        # after the backward has released the activations: the peak is the larger phase.
        buf += max(0, step - (act + logit + buf))
    elif stacks.has_torch_adam_temp(stack):
        buf += optimizer_temp_bytes(n, layout)
    rt = runtime_bytes(device)
    dynamic = w + g + o + act + logit + buf
    if device == "cpu":
        # glibc malloc keeps freed blocks of the step's temporaries in its arenas: peak RSS
        # exceeds the live bytes (measured against the trainer, tests/models/).
        rt += int((CPU_ALLOCATOR_OVERHEAD - 1.0) * dynamic)
    total = dynamic + rt
    sigma = None
    if measured is not None and measured.sigma_bytes is not None:
        # One measurement for every layer and micro-batch: their errors add linearly.
        sigma = int(stored_layers(model, layout, stage) * measured.sigma_bytes)
    return MemoryEstimate(stage, n, w, g, o, act, logit, buf, rt, total, (total,),
                          profiled=measured is not None, grad_accum_dtype=grad_accum_dtype,
                          activations_sigma_bytes=sigma)


def estimate_memory(model: ModelConfig, layout: Layout, *, dtype: str = "bf16",
                    device: str | None = None,
                    profile: LayerProfile | None = None,
                    stack: str = "deepspeed",
                    grad_accum_dtype: str | None = None) -> MemoryEstimate:
    """Predicted peak memory per device of ``layout`` training ``model``; under
    DeepSpeed's engine with ``grad_accum_dtype`` as its gradient accumulation dtype where
    known (:func:`autotune.models.stacks.known_grad_accum_dtype`).

    ``device`` picks the runtime allowance (``"cpu"`` or an accelerator name);
    ``model.attention`` says whether the attention scores are stored (see
    :func:`layer_activation_bytes`). With a ``profile`` that measured the bytes of this
    layout's layer shape on ``device`` (and where they exceed the analytic states), the
    stored activations per layer are the measured ones (:func:`measured_layer_activation`;
    ``profiled`` is then true).
    """
    measured = measured_layer_activation(model, layout, dtype=dtype, device=device,
                                         profile=profile)
    if measured is not None and not measured.usable:
        measured = None
    if layout.pp == 1:
        return _stage_estimate(model, layout, dtype, "only", device, measured, stack,
                               grad_accum_dtype)
    first = _stage_estimate(model, layout, dtype, "first", device, measured, stack,
                            grad_accum_dtype)
    last = _stage_estimate(model, layout, dtype, "last", device, measured, stack,
                           grad_accum_dtype)
    worst = first if first.peak_bytes >= last.peak_bytes else last
    return MemoryEstimate(**{**worst.__dict__,
                             "stage_peak_bytes": (first.peak_bytes, last.peak_bytes)})
