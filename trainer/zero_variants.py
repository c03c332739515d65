"""ZeRO-3's variants in the trainer: MiCS's model construction and the check that the
engine runs the variant the layout asks for.

hpZ needs nothing but its config key (``zero_hpz_partition_size``, from
:func:`autotune.dsconfig.zero_variant_keys`): DeepSpeed's stage-3 optimizer builds the
secondary partition groups itself. MiCS needs the model built under
``deepspeed.zero.MiCS_Init``: ``MiCS_Optimizer`` refuses parameters partitioned any other
way ("To use MiCS sharding, please use deepspeed.zero.MiCS_Init", DeepSpeed 0.18.9
``deepspeed/runtime/zero/mics.py``), and DeepSpeed 0.19 removed MiCS altogether, so a MiCS
trial runs only where the trainer's DeepSpeed is older (the study's feasibility check says
so before launching: :mod:`autotune.feasibility.strategies`).

:func:`check_zero3_variant` fails the trial when the engine does not run the variant
(a DeepSpeed that silently ignored a key would otherwise measure plain ZeRO-3 under the
variant's name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from autotune.layout import Layout

__all__ = ["zero3_variant_init", "check_zero3_variant"]


@contextlib.contextmanager
def zero3_variant_init(layout: Layout, config: dict[str, Any], dp_group: Any) -> Iterator[None]:
    """The context the model is built in: ``MiCS_Init`` over the data-parallel group for
    MiCS, nothing otherwise (the engine partitions a plain or hpZ model itself)."""
    if layout.zero_variant != "mics":
        yield
        return
    import deepspeed

    mics_init = getattr(deepspeed.zero, "MiCS_Init", None)
    if mics_init is None:
        raise RuntimeError(f"MiCS needs DeepSpeed < 0.19; this trainer runs DeepSpeed "
                           f"{deepspeed.__version__}, which has no deepspeed.zero.MiCS_Init")
    with mics_init(data_parallel_group=dp_group, config_dict_or_path=config):
        yield


def check_zero3_variant(engine: Any, layout: Layout) -> None:
    """A :class:`RuntimeError` unless ``engine`` runs ``layout``'s ZeRO-3 variant."""
    if layout.zero_variant == "hpz":
        got = engine.zero_hpz_partition_size()
        if got != layout.zero_shard:
            raise RuntimeError(f"hpZ: the engine's zero_hpz_partition_size is {got}, the "
                               f"layout asks for {layout.zero_shard}")
    elif layout.zero_variant == "mics":
        name = type(engine.optimizer).__name__
        if name != "MiCS_Optimizer":
            raise RuntimeError(f"MiCS: the engine's optimizer is {name}, not MiCS_Optimizer")
