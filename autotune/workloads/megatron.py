"""Megatron-DeepSpeed's command line: the flags autotune owns, in one place.

Shared by the ``megatron-deepspeed`` workload (a trial's argv) and ``autotune best --emit
megatron-deepspeed`` (:func:`autotune.report.export.megatron_deepspeed_args`), so that what
was measured is what is exported. Pure: no Megatron, DeepSpeed or torch import.

Flag names as defined in deepspeedai/Megatron-DeepSpeed ``megatron/arguments.py`` (commit
f1feb8877d760b4ceaa0551debbf1cb4026fc9be): ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size`` (``_add_distributed_args``), ``--micro-batch-size``,
``--global-batch-size``, ``--checkpoint-activations``, ``--recompute-granularity``,
``--recompute-method``, ``--recompute-num-layers``,
``--train-iters``, ``--log-interval``, ``--no-pipeline-parallel`` (``_add_training_args``),
``--sequence-parallel`` (in 4efb479 defined at line 972 of
``megatron/arguments.py``, beside ``--ds-sequence-parallel-size``, DeepSpeed's Ulysses,
which "cannot be combined" with it),
``--eval-iters``, ``--eval-interval`` (``_add_validation_args``), ``--save``
(``_add_checkpointing_args``), ``--zero-stage`` (``_add_zero_args``),
``--deepspeed-activation-checkpointing`` (``_add_activation_checkpoint_args``), ``--bf16``
(``_add_mixed_precision_args``); ``--deepspeed`` and ``--deepspeed_config`` come from
DeepSpeed's ``add_config_arguments`` (deepspeedai/DeepSpeed ``deepspeed/__init__.py``,
commit 85a6a5db928f80352833adf449ab03b3565b0d57, ``_add_core_arguments``). argonne-lcf's
fork keeps these names (at ffa3456d68b630192fcaefcc3288bd18525b8d95: ``--recompute-
granularity``, ``--recompute-method``, ``--recompute-num-layers`` at lines 1268-1298 and
``--sequence-parallel`` at 1577 of its ``megatron/arguments.py``; its ``GPTModelPipe`` maps
``full`` + ``uniform`` to the checkpoint interval the same way, ``gpt_model.py`` line 522).

Why each owned flag:

* ``--no-pipeline-parallel`` at pp = 1: without it Megatron-DeepSpeed builds ``GPTModelPipe``
  and DeepSpeed's PipelineEngine even for one stage (``args.ds_pipeline_enabled = not
  args.no_pipeline_parallel``), which refuses ZeRO-2/3 and is not what pp = 1 means here.
* recompute ``full``: Megatron's own ``--recompute-granularity full --recompute-method
  uniform --recompute-num-layers 1`` (every layer checkpointed, one per unit). Both model
  paths honour it (deepspeedai/Megatron-DeepSpeed@4efb479d5317ce9b86096b9d8e3e8030b0b5263b):
  ``GPTModelPipe`` turns it into ``activation_checkpoint_interval = recompute_num_layers``
  (``megatron/model/gpt_model.py``: "deepspeed's pipeline doesn't support the block recompute
  method", hence ``uniform``), ``ParallelTransformer.forward`` calls ``_checkpointed_forward``
  for ``recompute_granularity == 'full'`` (``megatron/model/transformer.py``), which with
  ``uniform`` checkpoints ``recompute_num_layers`` layers at a time through Megatron's
  ``tensor_parallel.checkpoint``. Not DeepSpeed's ``--checkpoint-activations
  --deepspeed-activation-checkpointing``: that path crashed on CPU
  (``get_accelerator().Stream`` is None).
* recompute ``selective``: ``--recompute-granularity selective``, no ``--recompute-method``
  (``validate_args`` asserts "recompute method is not yet supported for selective
  recomputing granularity"). ``ParallelAttention`` then checkpoints its ``core_attention``
  (``checkpoint_core_attention``), but only on the non-flash path: with ``--use-flash-attn``
  the flag has no effect in that fork (``megatron/model/transformer.py``, where
  ``checkpoint_core_attention`` is set in the non-flash branch only).
* ``sequence_parallel``: ``--sequence-parallel``; Megatron drops it itself at tp = 1
  (``validate_args``), which the layout never asks for. On CUDA Megatron refuses to start
  without ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in the environment (``validate_args``), which
  :data:`SP_ENV` holds for the launch line. With pp > 1 the trial's DeepSpeed config turns
  DeepSpeed's partitioned pipeline sends off (:func:`autotune.dsconfig.pipeline_partitioning`).
* A user's own ``--checkpoint-activations``, ``--recompute-*``, ``--sequence-parallel``
  (or DeepSpeed's ``--ds-sequence-parallel-size``) would contradict the layout: refused.
* ``--train-iters``, ``--log-interval 1``, ``--eval-iters 0``: a short run that logs every
  iteration and never evaluates; no ``--save`` (a trial writes no checkpoint).

>>> from autotune.layout import Layout
>>> layout_args(Layout(tp=2, pp=1, dp=2, micro_batch=1, grad_accum=4, recompute="full"),
...             dtype="bf16")  # doctest: +NORMALIZE_WHITESPACE
['--tensor-model-parallel-size', '2', '--pipeline-model-parallel-size', '1',
 '--micro-batch-size', '1', '--global-batch-size', '8', '--zero-stage', '0',
 '--no-pipeline-parallel', '--recompute-granularity', 'full', '--recompute-method',
 'uniform', '--recompute-num-layers', '1', '--bf16']
>>> layout_args(Layout(tp=2, pp=2, dp=1, micro_batch=1, grad_accum=4, recompute="selective",
...                    sequence_parallel=True), dtype="fp32")[-3:]
['--recompute-granularity', 'selective', '--sequence-parallel']
>>> conflicting_flag(["--data-path", "x", "--micro-batch-size=4"])
(2, '--micro-batch-size', '--micro-batch-size')
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.workloads.strategy_flags import script_has_use_mics, strategy_args

__all__ = ["layout_args", "recompute_args", "trial_args", "model_args", "conflicting_flag",
           "model_mismatch", "flash_attention_flag", "OWNED_FLAGS", "MODEL_FLAGS", "FLASH_FLAGS",
           "SP_ENV", "script_has_use_mics"]

SP_ENV: dict[str, str] = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
"""The environment Megatron-DeepSpeed requires on CUDA with ``--sequence-parallel``
(``validate_args`` raises "Using sequence parallelism requires setting the environment
variable CUDA_DEVICE_MAX_CONNECTIONS to 1")."""

OWNED_FLAGS: dict[str, str] = {
    # user flag -> the flag autotune sets that it would contradict
    "--tensor-model-parallel-size": "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size": "--pipeline-model-parallel-size",
    "--micro-batch-size": "--micro-batch-size",
    "--global-batch-size": "--global-batch-size",
    "--rampup-batch-size": "--global-batch-size",
    "--zero-stage": "--zero-stage",
    "--no-pipeline-parallel": "--no-pipeline-parallel",
    # Recompute is the layout's (--recompute-granularity), whatever spelling a user has.
    "--recompute-granularity": "--recompute-granularity",
    "--recompute-method": "--recompute-method",
    "--recompute-num-layers": "--recompute-num-layers",
    "--recompute-activations": "--recompute-granularity",
    "--checkpoint-activations": "--recompute-granularity",
    "--deepspeed-activation-checkpointing": "--recompute-granularity",
    "--checkpoint-num-layers": "--recompute-num-layers",
    "--distribute-saved-activations": "--recompute-granularity",
    "--sequence-parallel": "--sequence-parallel",
    "--ds-sequence-parallel-size": "--ds-sequence-parallel-size",
    "--use-mics": "--use-mics",
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

DROPOUT_FLAGS = ("--hidden-dropout", "--attention-dropout")
"""Megatron's two dropout probabilities (``megatron/arguments.py``: both default to 0.1),
both ``model.dropout``: added when the user does not give them, so a trial runs the
dropout the study predicts memory and time for (without them Megatron drops out at 0.1
whatever the study says); when given they must agree with it."""


def layout_args(layout: Layout, *, dtype: str, use_mics: bool = False) -> list[str]:
    """The flags that say the layout (and the precision) in Megatron-DeepSpeed's words;
    ``use_mics``: the script builds its model under ``MiCS_Init`` on ``--use-mics``
    (:func:`script_has_use_mics`). ZeRO-3's variants are DeepSpeed config keys
    (:func:`autotune.dsconfig.zero_variant_keys`), Ulysses is ``--ds-sequence-parallel-size``
    (both forks, ``_add_distributed_args``; :mod:`autotune.workloads.strategy_flags`)."""
    args = ["--tensor-model-parallel-size", str(layout.tp),
            "--pipeline-model-parallel-size", str(layout.pp),
            "--micro-batch-size", str(layout.micro_batch),
            "--global-batch-size", str(layout.global_batch),
            "--zero-stage", str(layout.zero_stage)]
    if layout.pp == 1:
        args.append("--no-pipeline-parallel")
    args += recompute_args(layout)
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    args += strategy_args(layout, use_mics=use_mics)
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


def recompute_args(layout: Layout) -> list[str]:
    """Megatron's own recompute flags for the layout's ``recompute`` (module docstring):
    ``full`` every layer (``uniform``, 1 layer per unit), ``selective`` the attention core,
    nothing for ``none``."""
    if layout.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    if layout.recompute == "selective":
        return ["--recompute-granularity", "selective"]
    return []


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
    out += [item for flag in DROPOUT_FLAGS if flag not in have
            for item in (flag, f"{model.dropout:g}")]
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


def _probability(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


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
        if name not in MODEL_FLAGS and name not in DROPOUT_FLAGS:
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args)
                                                          else "")
        if name in DROPOUT_FLAGS:
            if _probability(value) != model.dropout:
                return i, f"{name} {value}", f"model.dropout {model.dropout:g}"
            continue
        attr = MODEL_FLAGS[name]
        if value != str(values[attr]):
            return i, f"{name} {value}", f"model.{attr} {values[attr]}"
    return None
