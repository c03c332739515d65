"""Megatron-DeepSpeed's flags for DeepSpeed-Ulysses and MiCS, and which scripts take them.

Both forks define ``--ds-sequence-parallel-size`` (DeepSpeed-Ulysses' degree;
``megatron/arguments.py``: deepspeedai 4efb479 line 974, argonne-lcf ffa3456 line 1582),
which multiplies into the world size (``data_parallel_size = world / (tp * pp * sp)``,
deepspeedai line 101) and which ``megatron/core/parallel_state.py`` allows only at
``tp = pp = 1`` (line 146 in both).

MiCS needs the model built under ``deepspeed.zero.MiCS_Init``: DeepSpeed's
``MiCS_Optimizer`` refuses parameters without MiCS's communicator ("To use MiCS
sharding, please use deepspeed.zero.MiCS_Init", ``deepspeed/runtime/zero/mics.py``,
0.18.9). Only argonne-lcf's ``pretrain_gpt_alcf.py`` does, on ``--use-mics``
(``_add_zero_args``, argonne-lcf ``megatron/arguments.py`` line 2719;
``pretrain_gpt_alcf.py`` line 105); both forks' ``pretrain_gpt.py`` use ``zero.Init``, so a
MiCS trial of them fails with DeepSpeed's own error line, kept as its reason. hpZ is a
DeepSpeed config key only (``zero_hpz_partition_size``) and works with ``zero.Init``.

>>> from autotune.layout import Layout
>>> strategy_args(Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=1, ulysses=2))
['--ds-sequence-parallel-size', '2']
>>> strategy_args(Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=1, zero_stage=3,
...                      zero_variant="mics", zero_shard=2), use_mics=True)
['--use-mics']
"""

from __future__ import annotations

from pathlib import Path

from autotune.layout import Layout

__all__ = ["strategy_args", "script_has_use_mics"]


def strategy_args(layout: Layout, *, use_mics: bool = False) -> list[str]:
    """``--ds-sequence-parallel-size`` for Ulysses; ``--use-mics`` for MiCS where the script
    takes it (``use_mics``)."""
    args: list[str] = []
    if layout.ulysses > 1:
        args += ["--ds-sequence-parallel-size", str(layout.ulysses)]
    if layout.zero_variant == "mics" and use_mics:
        args.append("--use-mics")
    return args


def script_has_use_mics(script: str | None) -> bool:
    """Whether the training script reads ``args.use_mics`` (argonne-lcf's
    ``pretrain_gpt_alcf.py``); a script that cannot be read is judged by its name."""
    if not script:
        return False
    try:
        return "args.use_mics" in Path(script).read_text(errors="replace")
    except OSError:
        return Path(script).name == "pretrain_gpt_alcf.py"
