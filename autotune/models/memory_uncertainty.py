"""How wrong the memory prediction may be: an error bar per term, the probability of fitting
and the verdict (*fits*, *uncertain*, *exceeds*).

:func:`autotune.models.memory.estimate_memory` gives one number, the sum of the tensors a
rank must hold at its peak. Several of those terms depend on things the model cannot see
(the DeepSpeed recipe, the loss kernel, the allocator's history), so the prediction is a
median with a spread. Each term's spread is one documented function below; they are
independent mechanisms, so their variances add (:func:`estimate_uncertainty`):

=========================  ==========================================================  =====
term                       what is unknown                                             sd
=========================  ==========================================================  =====
gradient accumulation      which DeepSpeed optimizer wrapper runs (fp32 or bf16         B/2
                           buffer, or none): :func:`grad_accumulation_sigma_bytes`
flat gradient partition    ZeRO 1-2 step's fp32 copy of the rank's gradient partition   2n/dp
activations                what Korthikanti et al.'s count omits (small buffers,       10% +
                           RoPE copies) and the backward's working set of one layer,   1 layer
                           or a recompute boundary wider than one layer (where a
                           layer profile measured the layer: its error bar, + 1 layer)
logits / loss              how many fp32 copies of the logits the loss holds at once   4 B/el
buffers                    whether the second bucket / staging copy / ``sqrt(v)``      1/2
                           temporary exists (``overlap_comm``, fused or foreach Adam)
runtime                    context, NCCL/oneCCL channel buffers, BLAS workspaces       1/3
fragmentation              caching-allocator waste beyond ``trial.memory_margin``      5-10%
=========================  ==========================================================  =====

(B: the bytes of a term that either exists or not; "1/2": half the term.) A term that is
either there or not, with no knowledge which, is a Bernoulli of ``p = 1/2`` times its size:
standard deviation ``B/2``, the largest a two-state term can have. That is the rule for the
configuration-dependent terms; the point prediction keeps each of them (the conservative
state), so the spread reaches down to the state without it.

**Distribution.** The true peak is modelled as log-normal around the (corrected)
prediction: ``ln(peak) ~ N(ln(c * predicted), s^2)`` with ``s^2 = ln(1 + cv^2) +
sigma_c^2``, where ``cv = sigma_bytes / predicted`` is the combined relative sd of the terms
(the log-normal with that coefficient of variation) and ``c``, ``sigma_c`` are a
multiplicative calibration correction and its log-sd (1 and 0 until a study measures its
own peaks: :mod:`autotune.models.calibration`). Why log-normal: a peak is positive; the
large errors are multiplicative (bytes per parameter, a fraction of fragmentation); a
calibration factor composes additively in log space; and the tail of overshoot is heavier
than that of undershoot (a forgotten buffer adds, the tensors that must exist cannot be
skipped). The prediction is the median: as likely over as under.

``P(fit) = P(peak <= usable) = Phi((ln(usable) - ln(c * predicted)) / s)``, usable = the
device memory less ``trial.memory_margin``. :func:`classify_fit` maps it to a
:class:`FitVerdict` with ``trial.memory_min_p_fit`` (default 2.5%, about 2 sd): *exceeds*
below it, *fits* above ``1 - min_p_fit``, *uncertain* in between. Only *exceeds* is
excluded. Nothing here is fitted to a measured table.

>>> from autotune.config.model import MODEL_PRESETS
>>> from autotune.layout import Layout
>>> from autotune.models.memory import estimate_memory
>>> lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=1, zero_stage=1,
...              recompute="full")
>>> est = estimate_memory(MODEL_PRESETS["gpt-1.3b"], lay, dtype="bf16")
>>> unc = estimate_uncertainty(MODEL_PRESETS["gpt-1.3b"], lay, est, dtype="bf16")
>>> round(unc.relative_sigma, 2)
0.18
>>> p = fit_probability(est.peak_bytes, 80 * 2**30, unc.relative_sigma)
>>> classify_fit(p, 0.025).value, classify_fit(fit_probability(est.peak_bytes, 10 * 2**30,
...     unc.relative_sigma), 0.025).value
('fits', 'exceeds')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.models import stacks
from autotune.models.memory import (
    MemoryEstimate,
    buffer_bytes,
    layer_activation_bytes,
    optimizer_temp_bytes,
    runtime_bytes,
    score_transient_bytes,
)
from autotune.models.p_fit import (
    fit_probability,
    log_sigma,
    oom_conditioned_p_fit,
    run_conditioned_p_fit,
)

__all__ = ["FitVerdict", "MemoryUncertainty", "MemoryVerdict", "estimate_uncertainty",
           "grad_accumulation_sigma_bytes", "flat_partition_sigma_bytes",
           "activation_sigma_bytes", "logits_sigma_bytes", "buffer_sigma_bytes",
           "runtime_sigma_bytes", "fragmentation_sigma_bytes", "log_sigma",
           "fit_probability", "classify_fit", "oom_conditioned_p_fit", "run_conditioned_p_fit",
           "ACTIVATION_UNCOUNTED_FRACTION", "FRAGMENTATION_SD", "FRAGMENTATION_SD_IRREGULAR",
           "RUNTIME_SD_FRACTION", "CPU_RUNTIME_SD_FRACTION", "DEFAULT_MIN_P_FIT"]

DEFAULT_MIN_P_FIT = 0.025
"""Default ``trial.memory_min_p_fit``: exclude only what is ~2 sd beyond the capacity."""

ACTIVATION_UNCOUNTED_FRACTION = 0.10
"""Relative sd of the stored activations: the tensors Korthikanti et al.'s count leaves out.

Korthikanti et al. 2022 (sec. 4.1) count "the main contributors" and ignore small buffers.
What our models add beyond them, counted for a Llama-70B layer at t = 2: the rotated Q and
K that RoPE saves (~1 s*b*h of ~34 s*b*h, 3%), RMSNorm's fp32 statistics and flash
attention's log-sum-exp (< 0.1%), kernel-specific saved tensors (a fused or unfused SwiGLU:
one ``s*b*f/t`` of four). 10% covers them with room for a framework that saves one more
tensor per layer."""

FRAGMENTATION_SD = 0.05
"""Relative sd (of the dynamic bytes) of caching-allocator fragmentation, regular steps."""

FRAGMENTATION_SD_IRREGULAR = 0.10
"""The same with activation recomputation or ZeRO-3, whose allocations are irregular."""

RUNTIME_SD_FRACTION = 1 / 3
"""Relative sd of the accelerator runtime allowance (1.5 +- 0.5 GiB)."""

CPU_RUNTIME_SD_FRACTION = 0.10
"""Relative sd of the CPU runtime allowance, which was measured (the ``cpu`` entry's
``runtime_bytes`` in autotune/hardware.py)."""


class FitVerdict(str, Enum):
    """The memory check's answer for one layout (``str`` values for CSV/JSON)."""

    FITS = "fits"
    """P(fit) >= 1 - min_p_fit: the prediction says it fits, beyond its error bar."""
    UNCERTAIN = "uncertain"
    """Within the error bar of the capacity: stays a candidate, weighted by P(fit)."""
    EXCEEDS = "exceeds"
    """P(fit) < min_p_fit (or a measured OOM dominates it): excluded."""


@dataclass(frozen=True)
class MemoryUncertainty:
    """The sd of each term of a :class:`MemoryEstimate` and their combination."""

    terms: tuple[tuple[str, int], ...]
    """``(term, sd in bytes)`` for each term with a spread, in the table's order."""
    sigma_bytes: int
    """sqrt of the sum of the terms' variances (independent mechanisms)."""
    peak_bytes: int
    """The estimate's peak the sigmas refer to."""

    @property
    def relative_sigma(self) -> float:
        """``sigma_bytes / peak_bytes``: the coefficient of variation of the peak."""
        return self.sigma_bytes / self.peak_bytes if self.peak_bytes > 0 else 0.0


@dataclass(frozen=True)
class MemoryVerdict:
    """The memory check on one layout: prediction, error bar, probability, verdict."""

    verdict: FitVerdict
    p_fit: float
    """P(true peak <= usable bytes) under the log-normal model (module docstring)."""
    predicted_bytes: int
    """The memory model's peak (worst stage), before any calibration correction."""
    corrected_bytes: int
    """``correction * predicted_bytes``: the median of the distribution."""
    sigma_bytes: int
    """sd of the true peak in bytes (log-normal with the combined log-sd)."""
    log_sigma: float
    """sd of ``ln(peak)``: terms and correction combined."""
    usable_bytes: int
    """Device memory less the margin: what the peak is compared with."""
    oom: str | None = None
    """Key of a measured OOM layout that dominates this one (then ``p_fit == 0``)."""
    profiled: bool = False
    """The prediction's stored activations are a layer profile's measured ones."""

    @property
    def headroom_sd(self) -> float:
        """``ln(usable / median) / s``: how many log-sds the median lies below the usable
        memory (``P(fit) = Phi(headroom_sd)`` before any measured OOM)."""
        if self.usable_bytes <= 0:
            return -math.inf
        if self.corrected_bytes <= 0:
            return math.inf
        z = math.log(self.usable_bytes / self.corrected_bytes)
        if self.log_sigma == 0.0:
            return math.inf if z >= 0 else -math.inf
        return z / self.log_sigma


# ------------------------------------------------------------------------ per-term sds


def grad_accumulation_sigma_bytes(n_params: int, layout: Layout, dtype: str) -> int:
    """sd of the gradient bytes below ZeRO-2 in bf16: which optimizer wrapper holds them.

    The point model charges 6 bytes per parameter (bf16 ``.grad`` + an fp32 accumulation
    buffer): DeepSpeed's ``BF16_Optimizer`` with ``data_types.grad_accum_dtype: fp32``,
    what Megatron-DeepSpeed's ALCF recipe sets for ZeRO-1 with a pipeline
    (argonne-lcf/Megatron-DeepSpeed ``ALCF/helpers.sh``, ``generateDSconfig``) and what
    older DeepSpeed did by default without ZeRO (``fp32_groups_gradients_flat`` of
    ``torch.float32``). Current DeepSpeed (deepspeedai/DeepSpeed@007cca6a,
    ``runtime/engine.py``: ``get_data_types`` defaults ``grad_accum_dtype`` to the model's
    dtype; ``_do_optimizer_sanity_check`` picks the wrapper) keeps instead

    * ZeRO-1: ``DeepSpeedZeroOptimizer`` (``runtime/zero/stage_1_and_2.py``): the bf16
      ``.grad`` and the flat bf16 copy of the rank's partition, ``grads_in_partition``:
      ``2 + 2/dp``;
    * ZeRO-0 with a pipeline: ``BF16_Optimizer`` with a bf16 buffer (``grad_acc_dtype``):
      ``2 + 2``;
    * ZeRO-0 without: ``FP16_Optimizer`` on bf16 (``DDP_BFLOAT16``): the ``.grad``, 2.

    Where autotune writes the trials' DeepSpeed config the recipe is known
    (:func:`autotune.models.stacks.known_grad_accum_dtype`) and the point model takes it;
    elsewhere (a ``command`` program, a replayed table) the difference ``B`` is a
    two-state term: sd ``B/2`` (module docstring). Zero for fp32, fp16 and ZeRO-2/3 (one
    path each).
    """
    if dtype != "bf16" or layout.zero_stage >= 2:
        return 0
    if layout.zero_stage == 1:
        alternative = 2 + 2 / layout.dp
    elif layout.pp > 1:
        alternative = 4
    else:
        alternative = 2
    return int(n_params * (6 - alternative) / 2)


def flat_partition_sigma_bytes(n_params: int, layout: Layout) -> int:
    """sd of the ZeRO 1-2 step's fp32 gradient partition, not in the point model.

    ``DeepSpeedZeroOptimizer.step`` converts the rank's flat gradient partition to the
    master weights' dtype, ``single_grad_partition = flat_grad_partition.to(fp32)``
    (deepspeedai/DeepSpeed@02aa38c3, ``runtime/zero/stage_1_and_2.py``): ``4 n / dp``
    bytes. It is allocated after the backward has released the activations, so whether it
    adds to the step's peak depends on the sizes: a two-state term, sd ``2 n / dp``. The
    flat buffers' alignment padding (``nccl_start_alignment_factor * dp`` elements a
    group) is bytes, not GiB: ignored.
    """
    if layout.zero_stage not in (1, 2):
        return 0
    return int(2 * n_params / layout.dp)


def activation_sigma_bytes(model: ModelConfig, layout: Layout, dtype: str,
                           stored_bytes: int, *, measured_sigma_bytes: int | None = None,
                           ) -> int:
    """sd of the activations a stage holds (``stored_bytes``, the estimate's term).

    Two independent parts, in quadrature:

    * what the count leaves out: :data:`ACTIVATION_UNCOUNTED_FRACTION` of the stored bytes
      (Korthikanti et al. 2022, sec. 4.1, count only the main contributors); where a layer
      profile measured the stored bytes per layer, their error bar instead
      (``measured_sigma_bytes``, :attr:`~autotune.models.memory.MemoryEstimate.
      activations_sigma_bytes`): nothing is left out of a measurement;
    * one layer's working set (:func:`~autotune.models.memory.layer_activation_bytes` plus
      explicit attention's transient): without recompute the backward of a layer holds the
      gradients of its activations beside them, which the stored count does not include;
      with full recompute the point model charges one recomputed layer, and a wider
      recompute boundary (Megatron's ``--recompute-num-layers``, DeepSpeed's
      ``checkpoint_num_layers``) or a partitioned one (``partition_activations``: the
      stored inputs split over TP) moves it by about a layer either way (Korthikanti et
      al. 2022, sec. 4: full recompute stores each checkpointed block's input).

    The second part is one layer's, which does not grow with the layer count: a profile's
    slope does not measure it, so it stays either way.
    """
    one_layer = (layer_activation_bytes(model, layout, dtype)
                 + score_transient_bytes(model, layout, dtype))
    uncounted = (ACTIVATION_UNCOUNTED_FRACTION * stored_bytes if measured_sigma_bytes is None
                 else measured_sigma_bytes)
    return int(math.hypot(uncounted, one_layer))


def logits_sigma_bytes(model: ModelConfig, layout: Layout, stage: str) -> int:
    """sd of the loss's logits on the last stage: one fp32 copy of them.

    The point model charges the logits in the training dtype plus one fp32 copy. At the
    loss's peak one to three fp32 copies coexist, depending on the kernel: the upcast, the
    softmax saved for backward, and its gradient (Megatron's vocabulary-parallel cross
    entropy saves ``exp_logits`` and writes the gradient into it; ``torch.nn.functional.
    cross_entropy`` saves the log-softmax and allocates its gradient). sd: one copy,
    ``4 s b ceil(V/t)`` bytes. Zero on stages without the output layer.
    """
    if stage not in ("last", "only"):
        return 0
    return 4 * model.seq_len * layout.micro_batch * math.ceil(model.vocab_size / layout.tp)


def buffer_sigma_bytes(model: ModelConfig, layout: Layout, dtype: str, n_params: int, *,
                       stack: str = "deepspeed") -> int:
    """sd of the communication buffers and the optimizer's temporary: half of each.

    Each is configuration-dependent (a two-state term, sd ``B/2``): the second gradient
    bucket exists with ``overlap_comm`` or a collective's staging copy, not otherwise
    (``IPGBucket.buffer`` of ``reduce_bucket_size`` elements, ``bucket.index`` swapping
    between two with ``overlap_comm``: deepspeedai/DeepSpeed@02aa38c3,
    ``runtime/zero/stage_1_and_2.py``); ZeRO-3's gathered layers depend on
    ``stage3_prefetch_bucket_size`` and ``stage3_max_live_parameters``; torch's foreach
    AdamW allocates ``sqrt(v)`` for every updated parameter (``torch/optim/adamw.py``,
    ``_multi_tensor_adamw``), the fused one does not. A ``stack`` that is known to have
    neither (:mod:`autotune.models.stacks`) has no spread here.
    """
    buf = buffer_bytes(model, layout, dtype, n_params) if stacks.has_deepspeed_buckets(
        stack) else 0
    temp = optimizer_temp_bytes(n_params, layout) if stacks.has_torch_adam_temp(stack) else 0
    return int(math.hypot(buf / 2, temp / 2))


def runtime_sigma_bytes(device: str | None) -> int:
    """sd of the runtime allowance (:func:`~autotune.models.memory.runtime_bytes`).

    Accelerators: the allowance (1.5 GiB) is a sum of parts whose sizes vary with the
    driver, the library versions and the layout: the CUDA / Level-Zero context (~0.3-1
    GiB), NCCL's channel buffers (``NCCL_BUFFSIZE``, 4 MiB by default, per channel and peer,
    in each of the TP, PP and DP communicators: tens of MiB to ~1 GiB; oneCCL likewise),
    cuBLAS/oneDNN workspaces (``CUBLAS_WORKSPACE_CONFIG``: tens of MiB per stream). sd:
    :data:`RUNTIME_SD_FRACTION` of it, 0.5 GiB. CPU: the allowance was measured
    (the comment on the ``cpu`` entry's ``runtime_bytes`` in ``autotune/hardware.py``),
    sd :data:`CPU_RUNTIME_SD_FRACTION`.
    """
    if device == "cpu":
        return int(CPU_RUNTIME_SD_FRACTION * runtime_bytes("cpu"))
    return int(RUNTIME_SD_FRACTION * runtime_bytes(device))


def fragmentation_sigma_bytes(layout: Layout, dynamic_bytes: int) -> int:
    """sd of the caching allocator's fragmentation, a fraction of the dynamic bytes.

    PyTorch's caching allocator (CUDA semantics, "Memory management"; XPU's is the same
    design) keeps freed blocks for reuse and splits large segments; a request that fits no
    free block needs new memory although the free total would suffice, so the reserved
    memory exceeds the allocated, and what the device refuses is a reservation
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments`` exists to reduce this). GMLake (Guo et
    al., ASPLOS 2024) measured 15% fragmentation on average, up to 33%, on LLM training
    with recomputation, ZeRO/offload and LoRA, whose allocations are irregular, against a
    regular pattern without them. The expected waste is what ``trial.memory_margin``
    keeps free (5% by default); its sd is :data:`FRAGMENTATION_SD` of the dynamic bytes, and
    :data:`FRAGMENTATION_SD_IRREGULAR` with full recompute or ZeRO-3 (GMLake's mean then
    ~1 sd above the margin, its maximum ~3 sd).
    """
    irregular = layout.recompute == "full" or layout.zero_stage >= 3
    return int((FRAGMENTATION_SD_IRREGULAR if irregular else FRAGMENTATION_SD) * dynamic_bytes)


def estimate_uncertainty(model: ModelConfig, layout: Layout, est: MemoryEstimate, *,
                         dtype: str = "bf16", device: str | None = None,
                         stack: str = "deepspeed") -> MemoryUncertainty:
    """Each term's sd for the worst stage of ``est`` and their combination. ``stack``
    (:mod:`autotune.models.stacks`): under Megatron's own optimizer the gradients have one
    path (its fp32 buffer) and there is no ZeRO partition copy nor DeepSpeed bucket.

    The terms are independent mechanisms (a recipe, a kernel, the allocator), so the
    variances add. The stages' errors are not independent (the same recipe and kernels on
    every stage): the worst stage's probability of fitting stands for the layout's.
    """
    n = est.params_per_rank
    dynamic = est.peak_bytes - est.runtime_bytes
    megatron = stacks.is_megatron(stack)
    terms = (
        # Known where autotune writes the DeepSpeed config (est.grad_accum_dtype): no term.
        ("grad_accumulation", 0 if megatron or est.grad_accum_dtype is not None
         else grad_accumulation_sigma_bytes(n, layout, dtype)),
        ("flat_partition", 0 if megatron else flat_partition_sigma_bytes(n, layout)),
        ("activations", activation_sigma_bytes(
            model, layout, dtype, est.activations_bytes,
            measured_sigma_bytes=est.activations_sigma_bytes if est.profiled else None)),
        ("logits", logits_sigma_bytes(model, layout, est.stage)),
        ("buffers", buffer_sigma_bytes(model, layout, dtype, n, stack=stack)),
        ("runtime", runtime_sigma_bytes(device)),
        ("fragmentation", fragmentation_sigma_bytes(layout, dynamic)),
    )
    sigma = math.sqrt(sum(float(s) ** 2 for _, s in terms))
    return MemoryUncertainty(tuple((k, s) for k, s in terms if s), int(sigma), est.peak_bytes)


# -------------------------------------------------------------- probability and verdict


def classify_fit(p_fit: float, min_p_fit: float) -> FitVerdict:
    """*exceeds* below ``min_p_fit``, *fits* at or above ``1 - min_p_fit``, else
    *uncertain*. ``min_p_fit = 0`` never excludes on the prediction alone."""
    if p_fit < min_p_fit:
        return FitVerdict.EXCEEDS
    if p_fit >= 1.0 - min_p_fit:
        return FitVerdict.FITS
    return FitVerdict.UNCERTAIN
