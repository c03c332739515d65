"""Activation memory of one training step: what the layers store for the backward pass.

Split from :mod:`autotune.models.memory` (which sums these with the model states, buffers
and the runtime allowance): the stored activations per layer and micro-batch (Korthikanti
et al. 2022, eq. 1-2), the micro-batches in flight under 1F1B (Narayanan et al. 2021), the
attention scores of the explicit path, one layer's working set and the output layer's
tensors. Every function is re-exported by :mod:`autotune.models.memory`.
"""

from __future__ import annotations

import math

from autotune.config.model import ModelConfig
from autotune.layout import Layout

__all__ = ["dtype_bytes", "stage_layers", "layer_activation_bytes", "attention_score_bytes",
           "stored_layers", "stored_layer_bytes", "activation_bytes", "one_layer_working_bytes",
           "score_transient_bytes", "logits_bytes", "output_layer_bytes"]


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of the training dtype (``bf16``/``fp16``: 2, ``fp32``: 4)."""
    return 4 if dtype == "fp32" else 2


def stage_layers(model: ModelConfig, pp: int) -> int:
    # DeepSpeed's 'type:transformer' partition gives every stage n_layer/pp layers; when
    # pp does not divide n_layer some stages get one more, and the peak is what matters.
    return math.ceil(model.n_layer / pp)



def layer_activation_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """Activations one transformer layer stores for one micro-batch (no full recompute).

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models" (arXiv:2205.05198), eq. 2 (tensor parallel, no sequence parallelism), for
    16-bit training::

        s b h (10 + 24 / t + 5 a s / (h t))

    The 10 are replicated (LayerNorm inputs, linear inputs, dropout masks), the 24 split
    over TP: 8 of attention (Q, K, V, attention output) and 16 of the MLP's two ``4h``
    tensors (the GELU input and the down projection's input, 2 bytes each), written here
    for any MLP width as ``4 f / h``. The ``5 a s / h`` term is the attention score
    matrix, softmax output and dropout mask (:func:`attention_score_bytes`); fused/flash
    attention (torch SDPA, which our trainer uses) never stores them (Dao et al. 2022; only
    a per-row log-sum-exp, negligible), so it is dropped when ``model.attention ==
    "flash"``. For fp32 the 2-byte terms double (the 1-byte dropout masks are a small
    part: ignored).

    Sequence parallelism (``layout.sequence_parallel``; section 4.2.2, eq. 4) splits the
    replicated 10 along the sequence too: ``s b h (34 / t + 5 a s / (h t))``, every term
    over ``t``. Selective recompute (``layout.recompute == "selective"``; section 5, eq. 5-6)
    stores none of the score term, which it recomputes: ``s b h (10 + 24 / t)``, and with
    both ``34 s b h / t``.

    The formula assumes dropout (Megatron's default 0.1). Without it (``model.dropout ==
    0``, the built-in trainer) the two hidden-dropout masks (``2 s b h``, replicated) and the
    attention dropout's mask and output (``3 a s^2 b / t``) are not stored: ``s b h (8 + 24 /
    t + 2 a s / (h t))``. Measured against the trainer's explicit-attention path in
    ``tests/models/test_memory_vs_trainer.py`` and, per technique, in
    ``tests/models/test_memory_sp_selective.py``.

    SwiGLU (``down(silu(gate x) * up x)``), the same derivation adapted: the MLP input is
    stored once (replicated, in the 10) and autograd keeps four ``s b f / t`` tensors
    where GELU keeps two: the gate output (SiLU's input), the up output and the SiLU
    output (the product's two operands), and the product (the down projection's input),
    i.e. ``8 f / h`` instead of ``4 f / h``. (Megatron's fused ``bias_swiglu`` recomputes
    the SiLU in backward and keeps three; the trainer runs it unfused.)

    >>> from autotune.config.model import ModelConfig
    >>> m = ModelConfig(n_layer=1, hidden=1024, n_head=16, seq_len=2048, vocab_size=512,
    ...                 attention="explicit", dropout=0.1)
    >>> def per_sbh(**kw):  # the bracket of Korthikanti et al.'s table 2, 16-bit
    ...     lay = Layout(tp=8, pp=1, dp=1, micro_batch=1, grad_accum=1, **kw)
    ...     return layer_activation_bytes(m, lay, "bf16") / (2048 * 1024)
    >>> a_s_h = 16 * 2048 / 1024
    >>> per_sbh() == 10 + 24 / 8 + 5 * a_s_h / 8
    True
    >>> per_sbh(sequence_parallel=True) == 34 / 8 + 5 * a_s_h / 8
    True
    >>> per_sbh(recompute="selective") == 10 + 24 / 8
    True
    >>> per_sbh(recompute="selective", sequence_parallel=True) == 34 / 8
    True
    """
    s, b, h, t = model.seq_len, layout.micro_batch, model.hidden, layout.tp
    f = model.ffn
    scale = dtype_bytes(dtype) / 2
    mlp_tensors = 4 if model.mlp == "swiglu" else 2  # stored s*b*f/t tensors, 2 bytes each
    replicated: float = 10 if model.dropout > 0 else 8  # the two 1-byte hidden-dropout masks
    if layout.sequence_parallel:
        replicated /= t  # the LayerNorm/dropout region is split along the sequence
    per = s * b * (h * (replicated + 8 / t) + 2 * mlp_tensors * f / t) * scale
    if layout.recompute != "selective":
        per += attention_score_bytes(model, layout, dtype)
    return int(per)


def attention_score_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """What one layer's attention core stores beyond Q, K and V for one micro-batch: with
    explicit attention the softmax output, ``2 a s^2 b / t`` bytes in 16-bit, and with
    dropout also its mask and output (``5 a s^2 b / t``; Korthikanti et al. 2022, eq. 1);
    zero with flash attention. Selective recompute recomputes exactly this."""
    if model.attention != "explicit":
        return 0
    s, b, a = model.seq_len, layout.micro_batch, model.n_head
    per_elem = 5 if model.dropout > 0 else 2  # softmax output; dropout mask (1) + output (2)
    return int(per_elem * a * s * s * b / layout.tp * dtype_bytes(dtype) / 2)


def stored_layers(model: ModelConfig, layout: Layout, stage: str) -> int:
    """Layer-micro-batches whose activations a ``stage`` stores at its peak: its layers
    times the micro-batches in flight (1F1B: ``pp`` on the first stage, 1 on the last;
    without pipelining the micro-batches of accumulation run one after another)."""
    in_flight = min(layout.pp, layout.grad_accum) if stage in ("first", "only") else 1
    return stage_layers(model, layout.pp) * in_flight


def stored_layer_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """What one layer keeps per micro-batch until its backward: its activations
    (:func:`layer_activation_bytes`), or with full recompute only its input, ``2 s b h``
    bytes in 16-bit (not split by TP; Chen et al. 2016, Korthikanti et al. 2022, sec. 4),
    ``2 s b h / t`` with sequence parallelism (the input is a sequence shard)."""
    if layout.recompute == "full":
        per = model.seq_len * layout.micro_batch * model.hidden * dtype_bytes(dtype)
        return per // layout.tp if layout.sequence_parallel else per
    return layer_activation_bytes(model, layout, dtype)


def activation_bytes(model: ModelConfig, layout: Layout, dtype: str, stage: str, *,
                     measured_layer_bytes: float | None = None) -> int:
    """Activations a ``stage`` stores at its peak, with the 1F1B in-flight count.

    Under 1F1B (Narayanan et al. 2021, section 2.2.1) the first stage holds up to
    ``pp`` micro-batches in flight, the last one 1; without pipelining the micro-batches
    of gradient accumulation run one after another (1 in flight). Each layer and
    micro-batch in flight keeps :func:`stored_layer_bytes` (``measured_layer_bytes``
    instead where a layer profile measured it:
    :func:`autotune.models.memory.measured_layer_activation`).

    Full recompute (Chen et al. 2016; Korthikanti et al. 2022, section 4) keeps only each
    layer's input per layer and micro-batch in flight, plus one layer's full working set
    while that layer is recomputed. Selective recompute stores no score matrices but
    recomputes one layer's (:func:`attention_score_bytes`) during that layer's backward.
    Explicit attention adds :func:`score_transient_bytes` either way. These one-layer
    terms do not grow with the layer count, so a profile's slope does not measure them:
    they stay analytic.
    """
    per_layer = (stored_layer_bytes(model, layout, dtype) if measured_layer_bytes is None
                 else measured_layer_bytes)
    stored = int(stored_layers(model, layout, stage) * per_layer)
    return stored + one_layer_working_bytes(model, layout, dtype)


def one_layer_working_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """What one layer holds beyond the stored activations while it runs: with full
    recompute its recomputed activations (:func:`layer_activation_bytes`), with selective
    recompute its recomputed score matrices (:func:`attention_score_bytes`), and with
    explicit attention :func:`score_transient_bytes` in every mode. It exists only inside
    one layer's forward or backward, never beside the output layer's tensors at the end of
    the forward pass (:func:`output_layer_bytes`):
    :func:`autotune.models.memory.estimate_memory` charges the larger of the two."""
    transient = score_transient_bytes(model, layout, dtype)
    if layout.recompute == "full":
        return layer_activation_bytes(model, layout, dtype) + transient
    if layout.recompute == "selective":
        return attention_score_bytes(model, layout, dtype) + transient
    return transient


def score_transient_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """Explicit attention's working set beyond what a layer stores: while one layer's
    softmax runs, its input scores exist beside the stored output, and in the backward
    pass the gradient of the scores beside the gradient of the probabilities: two more
    ``a s^2 b / t`` matrices of that one layer (measured against the trainer's explicit
    path: ``tests/models/test_memory_vs_trainer.py``). Zero for flash attention."""
    if model.attention != "explicit":
        return 0
    s, b = model.seq_len, layout.micro_batch
    return int(2 * model.n_head * s * s * b / layout.tp * dtype_bytes(dtype))


def logits_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """The last stage's logits kept for the loss: ``s b V/t`` in the training dtype plus
    their fp32 copy (the upcast / log-softmax that cross-entropy saves for backward)."""
    elems = model.seq_len * layout.micro_batch * math.ceil(model.vocab_size / layout.tp)
    return elems * (dtype_bytes(dtype) + 4)


def output_layer_bytes(model: ModelConfig, layout: Layout, dtype: str) -> int:
    """The last stage's output layer at the end of the forward pass: the final LayerNorm's
    stored input and output (``2 s b h`` in the training dtype, a sequence shard each with
    sequence parallelism: the output layer's column-parallel linear saves only its shard)
    and the logits kept for the loss (:func:`logits_bytes`).

    Korthikanti et al. (2022, sec. 4.1) leave the final LayerNorm out as small beside the
    layers' activations; it is kept here because this phase is compared with one layer's
    working set (:func:`one_layer_working_bytes`): the output layer's backward frees these
    tensors before any layer's backward begins, so the two never coexist, and with full
    recompute and a small vocabulary the working set is the larger one (measured against
    the trainer: ``tests/models/test_memory_sp_selective.py``)."""
    ln = 2 * model.seq_len * layout.micro_batch * model.hidden * dtype_bytes(dtype)
    if layout.sequence_parallel:
        ln //= layout.tp
    return ln + logits_bytes(model, layout, dtype)
