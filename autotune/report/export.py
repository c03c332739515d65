"""Exporters of the best layout: JSON, a DeepSpeed config, Megatron-DeepSpeed arguments.

>>> from autotune.layout import Layout
>>> lay = Layout(tp=2, pp=4, dp=2, micro_batch=1, grad_accum=16, zero_stage=1,
...              recompute="full")
>>> megatron_deepspeed_args(lay, dtype="bf16")[:8]  # doctest: +NORMALIZE_WHITESPACE
['--tensor-model-parallel-size', '2', '--pipeline-model-parallel-size', '4',
 '--micro-batch-size', '1', '--global-batch-size', '32']
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.atomic import write_json_atomic
from autotune.dsconfig import deepspeed_config
from autotune.layout import Layout
from autotune.runner.records import TrialAttr, study_fingerprint

__all__ = ["emit_best", "megatron_deepspeed_args", "best_json"]


def megatron_deepspeed_args(layout: Layout, *, dtype: str,
                            model: dict[str, Any] | None = None) -> list[str]:
    """Megatron-DeepSpeed (``pretrain_gpt.py``) arguments for ``layout``.

    Names as in microsoft/Megatron-DeepSpeed ``megatron/arguments.py``; ``--zero-stage``
    and ``--deepspeed-activation-checkpointing`` are its DeepSpeed additions.
    """
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
    if model:
        args += ["--num-layers", str(model["n_layer"]), "--hidden-size", str(model["hidden"]),
                 "--num-attention-heads", str(model["n_head"]),
                 "--ffn-hidden-size", str(model.get("ffn_hidden") or 4 * model["hidden"]),
                 "--seq-length", str(model["seq_len"]),
                 "--max-position-embeddings", str(model["seq_len"])]
        if model.get("mlp") == "swiglu":
            args.append("--swiglu")  # Megatron's gated MLP (3 matrices of ffn_hidden)
        if model.get("attention", "flash") == "flash":
            # What was tuned (fused attention, no score matrix); without the flag Megatron
            # materialises the scores (model.attention: explicit), slower and larger.
            args.append("--use-flash-attn")
    return args


def best_json(study: optuna.Study, layout: Layout, trial: FrozenTrial) -> dict[str, Any]:
    keys = (TrialAttr.MODEL_TFLOPS, TrialAttr.HARDWARE_TFLOPS, TrialAttr.MFU,
            TrialAttr.STEP_TIME_S, TrialAttr.TOKENS_PER_S, TrialAttr.PEAK_MEMORY_GIB,
            TrialAttr.DEVICE_NAME)
    return {"study": study.study_name, "trial": trial.number, "layout": layout.to_dict(),
            "world_size": layout.world_size, "global_batch": layout.global_batch,
            **{k: trial.user_attrs[k] for k in keys if k in trial.user_attrs}}


def emit_best(study: optuna.Study, layout: Layout, trial: FrozenTrial, *, fmt: str,
              out_dir: Path) -> str:
    """Text to print for ``autotune best --emit FMT``; ``deepspeed`` also writes
    ``OUT_DIR/ds_config.json`` (atomically)."""
    fp = study_fingerprint(study)
    dtype = fp.get("dtype", "bf16")
    summary = best_json(study, layout, trial)
    if fmt == "json":
        return json.dumps(summary, indent=2)
    deepspeed_args = ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    if fmt == "deepspeed":
        path = out_dir / "ds_config.json"
        write_json_atomic(path, deepspeed_config(layout, dtype))
        mega = megatron_deepspeed_args(layout, dtype=dtype, model=fp.get("model"))
        return "\n".join([
            f"wrote {path} for {layout.key()} "
            f"({trial.value:.4g} model TFLOPS/device, trial #{trial.number})",
            "launch (Megatron-DeepSpeed):",
            "  deepspeed pretrain_gpt.py " + shlex.join(mega + deepspeed_args),
            f"tensor parallel {layout.tp} x pipeline {layout.pp} x data parallel {layout.dp}"
            f" = {layout.world_size} devices",
        ])
    mega = megatron_deepspeed_args(layout, dtype=dtype, model=fp.get("model"))
    return shlex.join(mega)
