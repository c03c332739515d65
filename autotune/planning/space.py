"""The layout space of a study: every combination of the search axes that makes whole numbers.

``dp`` follows from the world size and ``grad_accum`` from the global batch, so a layout
is chosen by (tp, pp, micro_batch, zero_stage, recompute,
sequence_parallel, zero_variant with its shard size, ulysses). :func:`enumerate_layouts`
lists every such combination with integral dp and grad_accum; the feasibility check then
decides which can run. The search, the planner and the replay launcher all draw from it.

A space may hold at most :data:`MAX_LAYOUTS` combinations (:func:`check_space_size`, run
when a study file is loaded and before every enumeration): each costs a feasibility check
and a cost-model estimate, so the bound is what keeps ``autotune plan`` within seconds
whatever a study file says (``devices_per_node: 10**20`` with ``auto`` axes would hang).

>>> from autotune.config.study import SearchConfig
>>> lays = enumerate_layouts(SearchConfig(zero_stage=(1,), recompute=("none",)),
...                          world_size=4, global_batch=8)
>>> len(lays), lays[0].key()
(20, 'tp1-pp1-dp4-mb1-ga2-z1-none')
"""

from __future__ import annotations

import math
from math import isqrt

from autotune.config.study import SearchConfig
from autotune.errors import SpecError
from autotune.layout import Layout

__all__ = ["axis_choices", "divisors", "enumerate_layouts", "space_size", "check_space_size",
           "MAX_LAYOUTS"]

MAX_LAYOUTS = 100_000
"""Most layout combinations a study's space may have (counted as (tp, pp) pairs that divide
the world size x micro-batch sizes x ZeRO stages x recompute choices). The largest shipped
study (GPT-175B on 1,024 devices, every axis ``auto``) has 2,904; ``autotune plan`` checks
and estimates some 50,000 layouts a second (2 s at the limit on one core)."""


def divisors(n: int) -> tuple[int, ...]:
    """Every divisor of ``n``, ascending, in O(sqrt n) steps (a world size may be 10**8)."""
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def axis_choices(search: SearchConfig, world_size: int, global_batch: int) -> dict[str, tuple]:
    """Concrete choices per axis (``auto`` resolved)."""
    tp = divisors(world_size) if isinstance(search.tp, str) else search.tp
    pp = divisors(world_size) if isinstance(search.pp, str) else search.pp
    if isinstance(search.micro_batch, str):  # "auto"
        mb: tuple[int, ...] = tuple(2**i for i in range(0, 11) if 2**i <= global_batch)
    else:
        mb = search.micro_batch
    return {"tp": tuple(tp), "pp": tuple(pp), "micro_batch": tuple(mb),
            "zero_stage": tuple(search.zero_stage), "recompute": tuple(search.recompute),
            "sequence_parallel": tuple(search.sequence_parallel),
            "zero_variant": tuple(search.zero_variant), "ulysses": tuple(search.ulysses)}


def _zero_choices(search: SearchConfig, zero_stage: int,
                  devices_per_node: int) -> list[tuple[str, int]]:
    """(variant, shard size) pairs for one ZeRO stage: the variants only at stage 3, each
    with ``search.zero_shard_size`` (default: the devices of a node)."""
    shards = search.zero_shard_size or (devices_per_node,)
    return [(v, 1 if v == "none" else s) for v in search.zero_variant
            if v == "none" or zero_stage == 3 for s in (shards if v != "none" else (1,))]


def space_size(search: SearchConfig, world_size: int, global_batch: int) -> tuple[int, str]:
    """How many combinations :func:`enumerate_layouts` would go through (an upper bound of
    its layouts), and how that number is made up (for messages)."""
    axes = axis_choices(search, world_size, global_batch)
    tps = [tp for tp in axes["tp"] if world_size % tp == 0]
    pairs = sum(1 for tp in tps for pp in axes["pp"] for u in axes["ulysses"]
                if (world_size // tp) % (pp * u) == 0)
    # The variants only at ZeRO stage 3: (stage, variant, shard) triples, not a product.
    zero = sum(len(_zero_choices(search, z, 2)) for z in axes["zero_stage"])
    rest = {k: len(axes[k]) for k in ("micro_batch", "recompute", "sequence_parallel")}
    n = pairs * zero * math.prod(rest.values())
    uly = f" x {len(axes['ulysses'])} ulysses" if len(axes["ulysses"]) > 1 else ""
    how = (f"{pairs} (tp, pp{', ulysses' if uly else ''}) combinations dividing the world "
           f"size {world_size} (of {len(axes['tp'])} tp x {len(axes['pp'])} pp values{uly})"
           f" x {zero} (zero_stage, zero_variant, shard) choices x "
           + " x ".join(f"{v} {k}" for k, v in rest.items()))
    return n, how


def check_space_size(search: SearchConfig, world_size: int, global_batch: int) -> int:
    """The space's size (:func:`space_size`); a :class:`SpecError` above :data:`MAX_LAYOUTS`."""
    n, how = space_size(search, world_size, global_batch)
    if n > MAX_LAYOUTS:
        raise SpecError("search", n, f"layouts in the space: {how}; allowed: at most "
                        f"{MAX_LAYOUTS} (list fewer search.tp, search.pp or "
                        "search.micro_batch values instead of 'auto', or fewer zero_stage/"
                        "recompute choices)")
    return n


def enumerate_layouts(search: SearchConfig, world_size: int, global_batch: int, *,
                      devices_per_node: int = 1) -> list[Layout]:
    """All layouts of the space with integral dp and grad_accum, in a stable order (a
    ZeRO-3 variant's shard size defaults to ``devices_per_node``). Layouts without the new
    axes (no variant, ``ulysses = 1``) come in the order they had before those axes."""
    check_space_size(search, world_size, global_batch)
    axes = axis_choices(search, world_size, global_batch)
    out: list[Layout] = []
    for tp in axes["tp"]:
        for pp in axes["pp"]:
            for uly in axes["ulysses"]:
                if world_size % (tp * pp * uly):
                    continue
                dp = world_size // (tp * pp * uly)
                for mb in axes["micro_batch"]:
                    if global_batch % (dp * mb):
                        continue
                    out.extend(_cell(search, axes, tp, pp, dp, uly, mb,
                                     global_batch // (dp * mb), devices_per_node))
    return out


def _cell(search: SearchConfig, axes: dict[str, tuple], tp: int, pp: int, dp: int, uly: int,
          mb: int, ga: int, devices_per_node: int) -> list[Layout]:
    out = []
    for z in axes["zero_stage"]:
        for variant, shard in _zero_choices(search, z, devices_per_node):
            for rc in axes["recompute"]:
                # tp = 1 has nothing to shard: one layout, without SP; SP never with Ulysses.
                sps = sorted({sp and tp > 1 and uly == 1 for sp in axes["sequence_parallel"]})
                for sp in sps:
                    out.append(Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=ga,
                                      zero_stage=z, recompute=rc, sequence_parallel=sp,
                                      zero_variant=variant,  # type: ignore[arg-type]
                                      zero_shard=shard, ulysses=uly))
    return out
