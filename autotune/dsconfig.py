"""The DeepSpeed config of a layout: used by the trainer, the exporter and foreign workloads.

:func:`batch_config` holds the keys the layout decides (batch arithmetic, ZeRO stage,
precision), the ones a trial's flags must agree with; :func:`deepspeed_config` adds what
autotune's trainer also needs (its optimizer). A foreign program brings its own optimizer,
so its trial config is :func:`batch_config` plus its extras
(:func:`autotune.workloads.foreign.trial_ds_config`).

Pure (no DeepSpeed import) so that ``autotune best --emit deepspeed`` is instant. Keys as
in DeepSpeed's config reference: https://www.deepspeed.ai/docs/config-json/.

>>> from autotune.layout import Layout
>>> cfg = deepspeed_config(Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=8,
...                                zero_stage=1), "bf16")
>>> cfg["train_batch_size"], cfg["zero_optimization"]["stage"], cfg["bf16"]["enabled"]
(16, 1, True)
"""

from __future__ import annotations

from typing import Any

from autotune.errors import SpecError
from autotune.layout import Layout

__all__ = ["deepspeed_config", "batch_config", "pipeline_partitioning", "zero_variant_keys",
           "LEARNING_RATE"]

LEARNING_RATE = 1e-3
"""Trials measure speed, not convergence: any stable learning rate will do."""


def batch_config(layout: Layout, dtype: str) -> dict[str, Any]:
    """The layout's DeepSpeed keys: ``train_batch_size`` is the global batch (DeepSpeed checks
    it equals micro-batch x accumulation x data-parallel size), the ZeRO stage, bf16.

    >>> batch_config(Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=3), "fp32")
    ... # doctest: +NORMALIZE_WHITESPACE
    {'train_batch_size': 12, 'train_micro_batch_size_per_gpu': 2,
     'gradient_accumulation_steps': 3, 'zero_optimization': {'stage': 0},
     'bf16': {'enabled': False}, 'steps_per_print': 2147483647, 'wall_clock_breakdown': False}
    """
    if dtype == "fp16":  # a study refuses it outside a replay (config.study)
        raise SpecError("run.dtype", dtype, "allowed: one of 'bf16', 'fp32'; no workload "
                        "autotune launches runs loss-scaled fp16")
    config: dict[str, Any] = {
        "train_batch_size": layout.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "zero_optimization": {"stage": layout.zero_stage, **zero_variant_keys(layout)},
        "bf16": {"enabled": dtype == "bf16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if layout.sequence_parallel and layout.pp > 1:
        config["pipeline"] = pipeline_partitioning(layout)
    return config


def zero_variant_keys(layout: Layout) -> dict[str, Any]:
    """The ``zero_optimization`` keys of a ZeRO-3 variant (DeepSpeed's
    ``deepspeed/runtime/zero/config.py``): ``mics_shard_size`` (MiCS; DeepSpeed < 0.19,
    which removed it, and the model built under ``deepspeed.zero.MiCS_Init``:
    ``MiCS_Optimizer`` refuses parameters partitioned otherwise) or
    ``zero_hpz_partition_size`` (hpZ). Ulysses has no key: DeepSpeed takes its sequence
    group from the ``mpu`` it is given (``deepspeed/utils/groups.py``,
    ``_get_sequence_parallel_world_size``).

    >>> zero_variant_keys(Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=1,
    ...                          zero_stage=3, zero_variant="hpz", zero_shard=4))
    {'zero_hpz_partition_size': 4}
    """
    if layout.zero_variant == "mics":
        return {"mics_shard_size": layout.zero_shard, "mics_hierarchical_params_gather": False}
    if layout.zero_variant == "hpz":
        return {"zero_hpz_partition_size": layout.zero_shard}
    return {}


def pipeline_partitioning(layout: Layout) -> dict[str, bool]:
    """DeepSpeed's ``pipeline`` keys for a layout with sequence parallelism and ``pp > 1``.

    DeepSpeed's PipelineEngine splits the tensor sent between stages over the TP group and
    all-gathers it on the receiver (``is_pipe_partitioned = is_model_parallel and
    pipeline['pipe_partitioned']``, both on by default; deepspeed/runtime/pipe/engine.py,
    DeepSpeed 0.19.8), which assumes the TP ranks hold the *same* activation. Under
    sequence parallelism each holds its own sequence shard, so the receiver would assemble
    pieces of different shards (the trainer's tp2-pp2 losses differed from the reference
    at the first step): both are turned off. The shard is already ``1/t`` of the
    activation, so the bytes sent are the same.

    >>> pipeline_partitioning(Layout(tp=2, pp=2, dp=1, micro_batch=1, grad_accum=2,
    ...                              sequence_parallel=True))
    {'pipe_partitioned': False, 'grad_partitioned': False}
    """
    del layout  # the same for every such layout; the argument says when it applies
    return {"pipe_partitioned": False, "grad_partitioned": False}


def deepspeed_config(layout: Layout, dtype: str, *, lr: float = LEARNING_RATE) -> dict[str, Any]:
    """DeepSpeed JSON config for ``layout``.

    ``train_batch_size`` is the global batch (DeepSpeed checks it equals micro-batch x
    accumulation x data-parallel size). ``torch_adam`` selects ``torch.optim.AdamW``:
    DeepSpeed's FusedAdam JIT-compiles for minutes on CPU and needs Intel's compiler on XPU.
    """
    config = batch_config(layout, dtype)
    config["optimizer"] = {"type": "AdamW", "params": {
        "lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True}}
    config["gradient_clipping"] = 0.0
    return config
