"""The layout space of a study: every combination of the search axes that makes whole numbers.

``dp`` follows from the world size and ``grad_accum`` from the global batch, so a layout
is chosen by (tp, pp, micro_batch, zero_stage, recompute). :func:`enumerate_layouts`
lists every such combination with integral dp and grad_accum; the feasibility check then
decides which can run. The search, the planner and the replay launcher all draw from it.

>>> from autotune.config.study import SearchConfig
>>> lays = enumerate_layouts(SearchConfig(zero_stage=(1,), recompute=("none",)),
...                          world_size=4, global_batch=8)
>>> len(lays), lays[0].key()
(20, 'tp1-pp1-dp4-mb1-ga2-z1-none')
"""

from __future__ import annotations

from autotune.config.study import SearchConfig
from autotune.layout import Layout

__all__ = ["axis_choices", "enumerate_layouts"]


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def axis_choices(search: SearchConfig, world_size: int, global_batch: int) -> dict[str, tuple]:
    """Concrete choices per axis (``auto`` resolved)."""
    tp = _divisors(world_size) if isinstance(search.tp, str) else search.tp
    pp = _divisors(world_size) if isinstance(search.pp, str) else search.pp
    if isinstance(search.micro_batch, str):  # "auto"
        mb: tuple[int, ...] = tuple(2**i for i in range(0, 11) if 2**i <= global_batch)
    else:
        mb = search.micro_batch
    return {"tp": tuple(tp), "pp": tuple(pp), "micro_batch": tuple(mb),
            "zero_stage": tuple(search.zero_stage), "recompute": tuple(search.recompute)}


def enumerate_layouts(search: SearchConfig, world_size: int, global_batch: int) -> list[Layout]:
    """All layouts of the space with integral dp and grad_accum, in a stable order."""
    axes = axis_choices(search, world_size, global_batch)
    out: list[Layout] = []
    for tp in axes["tp"]:
        for pp in axes["pp"]:
            if world_size % (tp * pp):
                continue
            dp = world_size // (tp * pp)
            for mb in axes["micro_batch"]:
                if global_batch % (dp * mb):
                    continue
                ga = global_batch // (dp * mb)
                for z in axes["zero_stage"]:
                    for rc in axes["recompute"]:
                        out.append(Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb,
                                          grad_accum=ga, zero_stage=z, recompute=rc))
    return out
