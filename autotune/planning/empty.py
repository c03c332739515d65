"""Why a study's layout space is empty: readable reasons for ``plan`` and ``run``.

A space can be empty before any feasibility rule runs, because no combination of the
search axes makes whole numbers (:func:`autotune.planning.space.enumerate_layouts` needs
``tp * pp`` to divide the world size and ``dp * micro_batch`` to divide the global batch),
or after it, because every layout is excluded. :func:`structural_reasons` names the axis
values that can never form a layout, with the values that would; :func:`empty_space_reasons`
puts ahead of them, for a space whose layouts all fail the check, the excluded counts by
first reason; :func:`no_layout_text` is the one sentence every command says it with.

>>> from autotune.config.study import SearchConfig
>>> structural_reasons(SearchConfig(tp=(2,), pp=(1,), micro_batch=(1,)), 3, 16)
['tp=2 does not divide the world size 3 (allowed tp: 1, 3)']
>>> structural_reasons(SearchConfig(tp=(1,), pp=(1,), micro_batch=(32,)), 1, 16)
['micro_batch 32 > global_batch 16']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from autotune.config.study import SearchConfig
from autotune.errors import UsageError
from autotune.feasibility import Constraints, Reason
from autotune.layout import Layout
from autotune.planning.candidates import partition_layouts, partition_space
from autotune.planning.space import axis_choices, divisors, enumerate_layouts
from autotune.spec import StudySpec

__all__ = ["structural_reasons", "empty_space_reasons", "excluded_summary", "no_layout_text",
           "table_empty_reasons", "empty_message", "refuse_empty", "refuse_structurally_empty"]


def _values(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values) if values else "none"


def structural_reasons(search: SearchConfig, world_size: int, global_batch: int) -> list[str]:
    """Every axis value of ``search`` that can form no layout on ``world_size`` devices at
    ``global_batch`` sequences per step, one sentence each with the allowed values; empty
    when each value takes part in at least one layout."""
    axes = axis_choices(search, world_size, global_batch)
    world_divisors = divisors(world_size)
    out: list[str] = []
    tps = [tp for tp in axes["tp"] if world_size % tp == 0]
    for tp in axes["tp"]:
        if world_size % tp:
            out.append(f"tp={tp} does not divide the world size {world_size} "
                       f"(allowed tp: {_values(world_divisors)})")
    if not tps:
        return out
    pairs = [(tp, pp) for tp in tps for pp in axes["pp"] if (world_size // tp) % pp == 0]
    for pp in axes["pp"]:
        if all((world_size // tp) % pp for tp in tps):
            allowed = sorted({d for tp in tps for d in divisors(world_size // tp)})
            out.append(f"pp={pp} does not divide the devices left by tp "
                       f"({', '.join(f'{world_size // tp} with tp={tp}' for tp in tps)}; "
                       f"allowed pp: {_values(allowed)})")
    if not pairs:
        return out
    dps = sorted({world_size // (tp * pp) for tp, pp in pairs})
    for mb in axes["micro_batch"]:
        if mb > global_batch:
            out.append(f"micro_batch {mb} > global_batch {global_batch}")
        elif all(global_batch % (dp * mb) for dp in dps):
            allowed = sorted({m for dp in dps for m in divisors(global_batch)
                              if global_batch % (dp * m) == 0})
            out.append(f"micro_batch {mb} times any dp ({_values(dps)}) does not divide "
                       f"global_batch {global_batch} (allowed micro_batch: {_values(allowed)})")
    return out


def excluded_summary(excluded: Sequence[tuple[Layout, Sequence[Reason]]],
                     limit: int = 3) -> list[str]:
    """The excluded layouts by first reason code, most frequent first, each with the
    message of its first layout (at most ``limit`` codes)."""
    return [f"{n} excluded by {code}, e.g. {example}"
            for code, n, example in by_first_reason(excluded)[:limit]]


def by_first_reason(excluded: Sequence[tuple[Layout, Sequence[Reason]]]
                    ) -> list[tuple[str, int, str]]:
    """``(code, count, example)`` of the excluded layouts by first reason code, most
    frequent first; the example is the first such layout's key and message."""
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for layout, reasons in excluded:
        code = reasons[0].code
        counts[code] += 1
        examples.setdefault(code, f"{layout.key()}: {reasons[0].message}")
    return [(code, n, examples[code]) for code, n in counts.most_common()]


def empty_space_reasons(search: SearchConfig, world_size: int, global_batch: int,
                        excluded: Sequence[tuple[Layout, Sequence[Reason]]] = ()) -> list[str]:
    """Why no layout is feasible: what excluded the layouts, then the axis values that form
    none (first what decided it: with layouts to exclude, an axis value that formed none
    is a side note); else one line saying the space has no layout, which only an empty
    axis gives."""
    reasons = structural_reasons(search, world_size, global_batch)
    if excluded:
        reasons = [f"all {len(excluded)} layouts are excluded", *excluded_summary(excluded),
                   *reasons]
    return reasons or [f"no combination of the search axes forms a layout on "
                       f"{world_size} devices at global_batch {global_batch}"]


def no_layout_text(reasons: Sequence[str]) -> str:
    """The one sentence for a space with no feasible layout, with ``reasons`` (from
    :func:`empty_space_reasons`): what ``run`` refuses with, ``plan`` exits with, and the
    scaling table and campaign print for such a size (one text for one fact: a user
    greps one phrase, whichever command said it).

    >>> no_layout_text(["micro_batch 32 > global_batch 16"])
    'no feasible layout in the search space: micro_batch 32 > global_batch 16'
    """
    return f"no feasible layout in the search space: {'; '.join(reasons)}"


def table_empty_reasons(excluded: Sequence[tuple[Layout, Sequence[Reason]]]) -> list[str]:
    """Why no row of a replayed table is feasible: what excluded its rows (the table is
    the study's space, so what its search axes would form says nothing). ``plan`` and
    ``run`` both say it."""
    return [f"all {len(excluded)} rows of the replayed table are excluded",
            *excluded_summary(excluded)]


def empty_message(spec: StudySpec, constraints: Constraints,
                  table: Sequence[Layout] | None = None) -> str:
    """The error ``run`` gives for a study with no feasible layout: the reasons for the
    study's own space, or for a replayed study the reasons for its ``table``'s rows, in
    the words ``plan`` uses for them."""
    where = spec.source or spec.name
    hint = f"; run `autotune plan {spec.source or 'STUDY'}` to see the excluded layouts"
    if table is not None:
        _, excluded = partition_layouts(table, spec.model, constraints)
        return f"{where}: {no_layout_text(table_empty_reasons(excluded))}{hint}"
    _, excluded = partition_space(spec.model, spec.cluster, spec.training, spec.search,
                                  constraints)
    reasons = empty_space_reasons(spec.search, spec.world_size, spec.training.global_batch,
                                  excluded)
    return f"{where}: {no_layout_text(reasons)}{hint}"


def refuse_empty(spec: StudySpec, reasons: Sequence[str]) -> int:
    """``plan``'s refusal of a space with nothing feasible: a usage error, as ``run``'s."""
    raise UsageError(f"{spec.source or spec.name}: {no_layout_text(reasons)}")


def refuse_structurally_empty(spec: StudySpec) -> None:
    """``run``'s check before it opens a database: a space whose axes form no layout at all
    is refused with its reasons (whether layouts are feasible needs the calibration, which
    needs the database: :func:`empty_message` says that later). A replayed study's space
    is its table, not its axes: nothing to refuse here."""
    if spec.launcher.kind == "replay":
        return
    if not enumerate_layouts(spec.search, spec.world_size, spec.training.global_batch):
        reasons = empty_space_reasons(spec.search, spec.world_size, spec.training.global_batch)
        raise UsageError(f"{spec.source or spec.name}: {no_layout_text(reasons)}")
