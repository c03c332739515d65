"""FLOPs of one GPT training step: the one place the formula lives.

Source: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC21, section 5.1, eq. 3. For a GPT with ``l`` layers, hidden ``h``,
sequence ``s``, vocabulary ``V`` and ``B`` sequences per step, with full activation
recomputation::

    F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))

The 96 is 4 passes (forward, backward = 2 forwards, recompute forward) x 24 B s h^2 per
layer forward. *Model* FLOPs count only the three passes that the model needs (Chowdhery
et al. 2022, PaLM, appendix B: model FLOPs utilisation), so without the recompute term::

    F_model = 72 B s l h^2 (1 + s / (6 h) + V / (12 l h))

Both are computed below from the per-matmul terms, which reduce to the formulas above for
the GELU-4h MLP and full multi-head attention, and stay right for other MLP sizes, for
grouped-query attention and for the gated (SwiGLU) MLP, whose three ``h x f`` matrices
cost ``3 * 2 h f`` per token instead of ``2 * 2 h f`` (Shazeer 2020, "GLU Variants Improve
Transformer"; the element-wise SiLU and product are not matmul FLOPs and, like the
softmax, are not counted).

>>> from autotune.config.model import ModelConfig
>>> m = ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=32, vocab_size=128)
>>> B, s, l, h, V = 3, 32, 2, 64, 128
>>> import math
>>> math.isclose(model_flops_per_step(m, B),
...              72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h)))
True
>>> math.isclose(hardware_flops_per_step(m, B, recompute=True),
...              96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)))
True

A SwiGLU MLP of width ``f`` adds one ``2 h f`` matmul per token and layer, x3 passes:

>>> g = ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=32, vocab_size=128, mlp="swiglu")
>>> model_flops_per_step(g, B) - model_flops_per_step(m, B) == 3 * l * B * s * 2 * h * (4 * h)
True
"""

from __future__ import annotations

from autotune.config.model import ModelConfig

__all__ = ["layer_forward_flops", "attention_core_forward_flops", "logits_forward_flops",
           "model_flops_per_step", "hardware_flops_per_step", "recompute_forward_fraction"]


def layer_forward_flops(model: ModelConfig, sequences: int) -> float:
    """Forward FLOPs of one transformer layer for ``sequences`` sequences.

    A multiply-add is 2 FLOPs. Per token: QKV projection ``2 h (h + 2 kv)``, attention
    output ``2 h^2``, MLP ``2 * 2 h f`` (GELU: up, down) or ``3 * 2 h f`` (SwiGLU: gate,
    up, down; Shazeer 2020); per sequence the score and value matmuls ``2 * 2 s^2 h``
    (Narayanan et al. 2021, eq. 3 derivation, generalised).
    """
    h, s, f = model.hidden, model.seq_len, model.ffn
    per_token = 2 * h * model.qkv_width + 2 * h * h + model.mlp_matrices * 2 * h * f
    return float(sequences * (s * per_token + 4 * s * s * h))


def attention_core_forward_flops(model: ModelConfig, sequences: int) -> float:
    """Forward FLOPs of the attention core, ``softmax(Q K^T) V``: the score and value
    matmuls, ``2 * 2 s^2 h`` per sequence: what selective recompute repeats (Korthikanti et
    al. 2022, section 5: "the recompute overhead is only the attention matmuls"; their
    eq. 8 counts it as ``4 b s^2 h`` per layer; the softmax is not a matmul FLOP)."""
    s, h = model.seq_len, model.hidden
    return float(sequences * 4 * s * s * h)


def recompute_forward_fraction(model: ModelConfig, recompute: str | bool) -> float:
    """The share of one layer forward that the recompute of ``recompute`` repeats in the
    backward: 1 for ``"full"`` (every layer forward again), the attention core's share
    (:func:`attention_core_forward_flops` over :func:`layer_forward_flops`) for
    ``"selective"``, 0 for ``"none"``. A bool means ``"full"``/``"none"``.

    >>> from autotune.config.model import ModelConfig
    >>> m = ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=32, vocab_size=128)
    >>> recompute_forward_fraction(m, "full"), recompute_forward_fraction(m, "none")
    (1.0, 0.0)
    >>> round(recompute_forward_fraction(m, "selective"), 4)  # s / (6 h + s) for GELU-4h
    0.0769
    """
    if recompute is True or recompute == "full":
        return 1.0
    if recompute == "selective":
        return attention_core_forward_flops(model, 1) / layer_forward_flops(model, 1)
    return 0.0


def logits_forward_flops(model: ModelConfig, sequences: int) -> float:
    """Forward FLOPs of the output (logit) layer: ``2 B s h V``."""
    return float(2 * sequences * model.seq_len * model.hidden * model.vocab_size)


def model_flops_per_step(model: ModelConfig, global_batch: int) -> float:
    """Model FLOPs of one optimizer step over ``global_batch`` sequences.

    Forward + backward (= 2 forwards) of every layer and of the logit layer; recompute is
    *not* counted (it is work the layout chose, not work the model needs).
    """
    fwd = model.n_layer * layer_forward_flops(model, global_batch)
    fwd += logits_forward_flops(model, global_batch)
    return 3.0 * fwd


def hardware_flops_per_step(model: ModelConfig, global_batch: int, *,
                            recompute: bool | str) -> float:
    """FLOPs the hardware executes: model FLOPs plus what the recompute repeats (one more
    layer forward with full recompute, the attention core with selective;
    :func:`recompute_forward_fraction`).

    This is what Megatron-DeepSpeed logs as "TFLOPs" (Narayanan et al. 2021, eq. 3, the
    factor 4 instead of 3 on the layers), kept for comparison with published numbers.
    """
    extra = (model.n_layer * layer_forward_flops(model, global_batch)
             * recompute_forward_fraction(model, recompute))
    return model_flops_per_step(model, global_batch) + extra


def tflops_per_device(flops_per_step: float, step_time_s: float, world_size: int) -> float:
    """TFLOPS per device of a step that does ``flops_per_step`` over ``world_size`` devices
    in ``step_time_s``: ``flops_per_step / (step_time_s * world_size) / 1e12``.

    The throughput of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training
    on GPU Clusters Using Megatron-LM"), section 5.1: the FLOPs of eq. 3 per iteration over
    the iteration time and the GPU count, as Megatron-DeepSpeed's ``throughput_calculator``
    (``megatron/utils.py``) prints it: ``flops_per_iteration / (elapsed_time_per_iter *
    args.world_size * 10**12)``. With :func:`model_flops_per_step` it is the objective
    (``model_tflops_per_device``), with :func:`hardware_flops_per_step` the hardware figure.
    The one place it is computed: the trainer, the read-back of a user's program, the cost
    model and the landscapes call it.

    >>> tflops_per_device(6e12, 0.5, 4)
    3.0
    """
    return flops_per_step / (step_time_s * world_size) / 1e12

