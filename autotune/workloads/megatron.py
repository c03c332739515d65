"""Megatron-DeepSpeed's command line: the flags autotune owns, in one place.

Shared by the ``megatron-deepspeed`` workload (a trial's argv) and ``autotune best --emit
megatron-deepspeed`` (:func:`autotune.report.export.megatron_deepspeed_args`), so that what
was measured is what is exported. Pure: no Megatron, DeepSpeed or torch import.

Flag names as defined in deepspeedai/Megatron-DeepSpeed ``megatron/arguments.py`` (commit
f1feb8877d760b4ceaa0551debbf1cb4026fc9be): ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size`` (``_add_distributed_args``), ``--micro-batch-size``,
``--global-batch-size``, ``--checkpoint-activations``, ``--recompute-granularity``,
``--train-iters``, ``--log-interval``, ``--no-pipeline-parallel`` (``_add_training_args``),
``--eval-iters``, ``--eval-interval`` (``_add_validation_args``), ``--save``
(``_add_checkpointing_args``), ``--zero-stage`` (``_add_zero_args``),
``--deepspeed-activation-checkpointing`` (``_add_activation_checkpoint_args``), ``--bf16``
(``_add_mixed_precision_args``); ``--deepspeed`` and ``--deepspeed_config`` come from
DeepSpeed's ``add_config_arguments`` (deepspeedai/DeepSpeed ``deepspeed/__init__.py``,
commit 85a6a5db928f80352833adf449ab03b3565b0d57, ``_add_core_arguments``). argonne-lcf's
fork keeps these names.

Why each owned flag:

* ``--no-pipeline-parallel`` at pp = 1: without it Megatron-DeepSpeed builds ``GPTModelPipe``
  and DeepSpeed's PipelineEngine even for one stage (``args.ds_pipeline_enabled = not
  args.no_pipeline_parallel``), which refuses ZeRO-2/3 and is not what pp = 1 means here.
* recompute ``full``: ``--checkpoint-activations`` is what the PipelineEngine path honours
  (``GPTModelPipe``'s ``activation_checkpoint_interval``), ``--deepspeed-activation-
  checkpointing`` routes the non-pipeline path through DeepSpeed's checkpointing; the user's
  own ``--recompute-*`` flags would contradict the layout.
* ``--train-iters``, ``--log-interval 1``, ``--eval-iters 0``: a short run that logs every
  iteration and never evaluates; no ``--save`` (a trial writes no checkpoint).

>>> from autotune.layout import Layout
>>> layout_args(Layout(tp=2, pp=1, dp=2, micro_batch=1, grad_accum=4, recompute="full"),
...             dtype="bf16")  # doctest: +NORMALIZE_WHITESPACE
['--tensor-model-parallel-size', '2', '--pipeline-model-parallel-size', '1',
 '--micro-batch-size', '1', '--global-batch-size', '8', '--zero-stage', '0',
 '--no-pipeline-parallel', '--checkpoint-activations',
 '--deepspeed-activation-checkpointing', '--bf16']
>>> conflicting_flag(["--data-path", "x", "--micro-batch-size=4"])
(2, '--micro-batch-size', '--micro-batch-size')
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config.model import ModelConfig
from autotune.layout import Layout

__all__ = ["layout_args", "trial_args", "model_args", "conflicting_flag", "model_mismatch",
           "flash_attention_flag", "OWNED_FLAGS", "MODEL_FLAGS", "FLASH_FLAGS"]

OWNED_FLAGS: dict[str, str] = {
    # user flag -> the flag autotune sets that it would contradict
    "--tensor-model-parallel-size": "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size": "--pipeline-model-parallel-size",
    "--micro-batch-size": "--micro-batch-size",
    "--global-batch-size": "--global-batch-size",
    "--rampup-batch-size": "--global-batch-size",
    "--zero-stage": "--zero-stage",
    "--no-pipeline-parallel": "--no-pipeline-parallel",
    "--checkpoint-activations": "--checkpoint-activations",
    "--deepspeed-activation-checkpointing": "--deepspeed-activation-checkpointing",
    "--recompute-activations": "--checkpoint-activations",
    "--recompute-granularity": "--checkpoint-activations",
    "--recompute-method": "--checkpoint-activations",
    "--recompute-num-layers": "--checkpoint-activations",
    "--checkpoint-num-layers": "--checkpoint-activations",
    "--bf16": "--bf16",
    "--fp16": "--bf16",
    "--train-iters": "--train-iters",
    "--train-samples": "--train-iters",
    "--train-tokens": "--train-iters",
    "--exit-interval": "--train-iters",
    "--log-interval": "--log-interval",
    "--eval-iters": "--eval-iters",
    "--eval-interval": "--eval-iters",
    "--save": "no --save",
    "--save-interval": "no --save",
    "--deepspeed": "--deepspeed",
    "--deepspeed_config": "--deepspeed_config",
    "--deepscale": "--deepspeed",
    "--deepscale_config": "--deepspeed_config",
}
"""Every flag a user argument may not give, with the owned flag it conflicts with."""

MODEL_FLAGS: dict[str, str] = {
    "--num-layers": "n_layer", "--hidden-size": "hidden", "--num-attention-heads": "n_head",
    "--seq-length": "seq_len", "--ffn-hidden-size": "ffn_hidden",
    "--num-key-value-heads": "n_kv_head",
}
"""Model flags: added from the study's ``model`` when the user does not give them, and
when given they must agree with it (the score's FLOPs are the study model's)."""


def layout_args(layout: Layout, *, dtype: str) -> list[str]:
    """The flags that say the layout (and the precision) in Megatron-DeepSpeed's words."""
    args = ["--tensor-model-parallel-size", str(layout.tp),
            "--pipeline-model-parallel-size", str(layout.pp),
            "--micro-batch-size", str(layout.micro_batch),
            "--global-batch-size", str(layout.global_batch),
            "--zero-stage", str(layout.zero_stage)]
    if layout.pp == 1:
        args.append("--no-pipeline-parallel")
    if layout.recompute == "full":
        args += ["--checkpoint-activations", "--deepspeed-activation-checkpointing"]
    if dtype == "bf16":
        args.append("--bf16")
    return args


def flash_attention_flag(device: str | None) -> str | None:
    """The fused-attention flag a device's Megatron-DeepSpeed users pass, ``None`` where
    none works.

    In both forks (``megatron/arguments.py``; deepspeedai 4efb479, argonne-lcf ffa3456)
    ``--use-flash-attn`` is FlashAttention v1 and asserts that the CUDA ``flash_attn``
    package imports: on an Intel Max 1550 and on a CPU it fails. Intel users pass
    ``--use-flash-attn-builder`` (DeepSpeed's op builder, ``megatron/model/
    transformer.py``: ``get_accelerator().create_op_builder("FlashAttentionBuilder")``);
    NVIDIA users ``--use-flash-attn-v2`` (the ``flash_attn`` 2.x package); a CPU has none.

    >>> [flash_attention_flag(d) for d in ("max1550-tile", "h100", "cpu", None)]
    ['--use-flash-attn-builder', '--use-flash-attn-v2', None, None]
    """
    if device is None or device == "cpu":
        return None
    if device.startswith("max1550"):
        return "--use-flash-attn-builder"
    return "--use-flash-attn-v2"


FLASH_FLAGS = ("--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2",
               "--use-flash-attn-triton", "--use-flash-attn-builder")
"""Every fused-attention flag of the forks: a user's own choice is kept."""


def model_args(model: ModelConfig, *, given: Sequence[str] = (),
               kernels: bool = True, device: str | None = None) -> list[str]:
    """The model's shape as flags, leaving out those the user ``given`` already;
    ``kernels`` adds the ``device``'s fused-attention flag (:func:`flash_attention_flag`)
    for ``attention: flash`` (what was tuned, for an export; a trial runs the user's own
    kernel choice)."""
    have = {_name(a) for a in given}
    out: list[str] = []
    values = _model_values(model)
    for flag, attr in MODEL_FLAGS.items():
        if flag in have or (attr == "n_kv_head" and model.n_kv_head is None):
            continue
        out += [flag, str(values[attr])]
    if "--max-position-embeddings" not in have:
        out += ["--max-position-embeddings", str(model.seq_len)]
    if model.mlp == "swiglu" and "--swiglu" not in have:
        out.append("--swiglu")  # Megatron's gated MLP (3 matrices of ffn_hidden)
    fused = flash_attention_flag(device)
    if kernels and model.attention == "flash" and fused and not have & set(FLASH_FLAGS):
        # What was tuned (fused attention, no score matrix); without the flag Megatron
        # materialises the scores (model.attention: explicit), slower and larger.
        out.append(fused)
    return out


def trial_args(*, train_iters: int, ds_config: str) -> list[str]:
    """The flags of a short measured run: ``train_iters`` iterations, one log line each,
    no evaluation, no checkpoint, DeepSpeed with the trial's ``ds_config.json`` (Megatron
    reads it with ``json.load``: a path, never DeepSpeed's base64 form)."""
    return ["--train-iters", str(train_iters), "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", str(train_iters + 1),
            "--deepspeed", "--deepspeed_config", ds_config]


def _model_values(model: ModelConfig) -> dict[str, int]:
    """The study model's value behind each of :data:`MODEL_FLAGS` (defaults resolved)."""
    return {"n_layer": model.n_layer, "hidden": model.hidden, "n_head": model.n_head,
            "seq_len": model.seq_len, "ffn_hidden": model.ffn, "n_kv_head": model.kv_heads}


def _name(arg: str) -> str:
    return arg.split("=", 1)[0] if arg.startswith("--") else arg


def conflicting_flag(args: Sequence[str]) -> tuple[int, str, str] | None:
    """``(index, user flag, owned flag)`` of the first user argument that gives a flag
    autotune owns (``--flag value`` and ``--flag=value`` alike), else ``None``."""
    for i, arg in enumerate(args):
        name = _name(arg)
        if name in OWNED_FLAGS:
            return i, name, OWNED_FLAGS[name]
    return None


def model_mismatch(args: Sequence[str], model: ModelConfig) -> tuple[int, str, str] | None:
    """``(index, user value, study value)`` of the first model flag in ``args`` whose value
    differs from the study's ``model`` (e.g. ``--num-layers 24`` against ``n_layer: 4``)."""
    values = _model_values(model)
    for i, arg in enumerate(args):
        name = _name(arg)
        if name == "--swiglu" and model.mlp != "swiglu":
            return i, "--swiglu", f"model.mlp {model.mlp!r}"
        if name not in MODEL_FLAGS:
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args)
                                                          else "")
        attr = MODEL_FLAGS[name]
        if value != str(values[attr]):
            return i, f"{name} {value}", f"model.{attr} {values[attr]}"
    return None
