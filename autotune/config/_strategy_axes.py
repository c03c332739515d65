"""The study file's ZeRO-3 variant and DeepSpeed-Ulysses axes (``search.zero_variant``,
``search.zero_shard_size``, ``search.ulysses``): reading and the cross-field rules.

:class:`autotune.config.study.SearchConfig` holds the values; this module owns how they are
read from YAML and which combinations a study file may not ask for (each a
:class:`~autotune.errors.SpecError`, exit code 2, naming the field). The rules that depend
on the model or the world size (a shard size dividing the ZeRO group, Ulysses dividing the
heads and the sequence) are feasibility rules (:mod:`autotune.feasibility.strategies`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.config._fields import check_choice, check_int, check_list
from autotune.errors import SpecError
from autotune.layout import ZERO_VARIANTS

__all__ = ["parse_strategy_axes", "check_strategy_axes"]


def _ints(field: str, value: Any, maximum: int) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    check_list(field, value)
    return tuple(sorted({check_int(f"{field}[{i}]", v, maximum=maximum)
                         for i, v in enumerate(value)}))


def parse_strategy_axes(data: dict[str, Any], *, max_degree: int) -> None:
    """Turn the YAML values of the three axes in ``data`` (the ``search`` mapping, changed
    in place) into tuples; a scalar is a one-value list."""
    if "zero_variant" in data:
        zv = data["zero_variant"]
        zv = [zv] if isinstance(zv, str) else zv
        for i, v in enumerate(check_list("search.zero_variant", zv)):
            check_choice(f"search.zero_variant[{i}]", v, ZERO_VARIANTS)
        data["zero_variant"] = tuple(dict.fromkeys(zv))
    if data.get("zero_shard_size") is not None:
        data["zero_shard_size"] = _ints("search.zero_shard_size", data["zero_shard_size"],
                                        max_degree)
    if "ulysses" in data:
        data["ulysses"] = _ints("search.ulysses", data["ulysses"], max_degree)


def check_strategy_axes(zero_variant: Sequence[str], zero_shard_size: Sequence[int] | None,
                        ulysses: Sequence[int], zero_stage: Sequence[int],
                        sequence_parallel: Sequence[bool]) -> None:
    """The study file's cross-field rules; a :class:`SpecError` naming the field.

    MiCS and hpZ are ZeRO-3 variants (DeepSpeed reads ``mics_shard_size`` and
    ``zero_hpz_partition_size`` at stage 3 only), so they need 3 among the ZeRO stages; a
    shard size means nothing without one of them; a shard size of 1 is plain ZeRO-3.
    Ulysses and Megatron's sequence parallelism exclude each other (Megatron-DeepSpeed's
    ``arguments.py``), so a study must leave at least one combination of the two.
    """
    for i, v in enumerate(zero_variant):
        check_choice(f"search.zero_variant[{i}]", v, ZERO_VARIANTS)
    variants = [v for v in zero_variant if v != "none"]
    if variants and 3 not in zero_stage:
        raise SpecError("search.zero_variant", list(zero_variant),
                        f"allowed: {', '.join(variants)} only with ZeRO stage 3 (a ZeRO-3 "
                        f"variant); search.zero_stage is {list(zero_stage)}: add 3")
    if zero_shard_size is not None:
        if not variants:
            raise SpecError("search.zero_shard_size", list(zero_shard_size),
                            "allowed only with search.zero_variant mics or hpz (the MiCS "
                            "shard / hpZ partition size)")
        for i, s in enumerate(zero_shard_size):
            check_int(f"search.zero_shard_size[{i}]", s, minimum=2)
    for i, u in enumerate(ulysses):
        check_int(f"search.ulysses[{i}]", u)
    if min(ulysses) > 1 and all(sequence_parallel):
        raise SpecError("search.ulysses", list(ulysses),
                        "allowed: include 1, or sequence_parallel false: DeepSpeed-Ulysses "
                        "and Megatron's sequence parallelism (search.sequence_parallel "
                        "true) cannot be combined (Megatron-DeepSpeed refuses it)")
