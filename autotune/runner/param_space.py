"""The distributions a trial's parameters are stored with: the study's own axis values.

optuna-dashboard rates parameter importance with Optuna's PED-ANOVA, which leaves out a
parameter whose distribution is single-valued (``BaseDistribution.single()``) and
otherwise compares the distribution of the best trials' values with that of all trials
within the *declared* range. An axis the study holds constant, stored as
``IntDistribution(0, 3)`` for ZeRO, looked to it like a choice among four that the best
trials all made alike, and was credited. So each axis is declared over the values the
study's search space gives it: a constant axis is single-valued and gets no credit; a
varying one spans its values.
Both come from ``optuna/importance/_ped_anova/evaluator.py`` (Optuna 5.1,
``dist.single()`` skips the parameter) and ``optuna_dashboard/_importance.py`` (the
dashboard's evaluator is ``PedAnovaImportanceEvaluator``).

Integer axes stay :class:`IntDistribution` and categorical axes keep their stable order
(``none, full, selective``), so a resumed study whose axes changed still stores
parameters Optuna reads back; their ranges then differ between trials, and Optuna's
intersection search space leaves such an axis out of the dashboard's importance rather
than crediting it wrongly.
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from autotune.layout import Layout
from autotune.planning.space import axis_choices
from autotune.spec import StudySpec

__all__ = ["RECOMPUTE_ORDER", "ZERO_VARIANT_ORDER", "layout_distributions"]

RECOMPUTE_ORDER = ("none", "full", "selective")
"""The categorical order of ``recompute`` ('selective' appended later: old choices keep
their indices)."""

ZERO_VARIANT_ORDER = ("none", "mics", "hpz")
"""The categorical order of ``zero_variant``."""


def layout_distributions(layout: Layout, spec: StudySpec) -> dict[str, BaseDistribution]:
    """One distribution per search axis over the study's values of it (``layout``'s own
    value always included)."""
    axes = axis_choices(spec.search, spec.world_size, spec.training.global_batch)
    params = layout.params()
    out: dict[str, BaseDistribution] = {}
    for name in ("tp", "pp", "micro_batch", "zero_stage"):
        values = {int(v) for v in axes[name]} | {int(params[name])}
        out[name] = IntDistribution(min(values), max(values))
    recompute = set(axes["recompute"]) | {params["recompute"]}
    out["recompute"] = CategoricalDistribution(
        [c for c in RECOMPUTE_ORDER if c in recompute]
        + sorted(c for c in recompute if c not in RECOMPUTE_ORDER))
    sp: set[Any] = {bool(v) for v in axes["sequence_parallel"]}
    sp |= {bool(params["sequence_parallel"])}
    out["sequence_parallel"] = CategoricalDistribution(sorted(sp))
    # The ZeRO-3 variants and Ulysses come after the axes above, so a study stored before
    # them keeps its parameters' meaning; a variant's shard size follows from the variant.
    variants = set(axes["zero_variant"]) | {params["zero_variant"]}
    out["zero_variant"] = CategoricalDistribution(
        [v for v in ZERO_VARIANT_ORDER if v in variants]
        + sorted(v for v in variants if v not in ZERO_VARIANT_ORDER))
    shards = {int(s) for s in (spec.search.zero_shard_size or (spec.cluster.devices_per_node,))}
    shards |= {1, int(params["zero_shard"])}
    out["zero_shard"] = IntDistribution(min(shards), max(shards))
    ulysses = {int(u) for u in axes["ulysses"]} | {int(params["ulysses"])}
    out["ulysses"] = IntDistribution(min(ulysses), max(ulysses))
    return out
