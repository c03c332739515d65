"""The memory check against what ran: no measured-ok row of a shipped landscape is excluded
at default settings, and what clearly cannot fit still is (issue #13, part 1).

The landscapes are read as the benchmarks read them (:func:`autotune.landscape.
load_landscape`: each group's model, cluster and dtype), and judged with the budget a study
with default ``trial`` settings would apply. Nothing is fitted to these rows: the sds are
the documented per-term ones of :mod:`autotune.models.memory_uncertainty`.
"""

from __future__ import annotations

from collections import Counter

import pytest

from autotune.config.model import MODEL_PRESETS
from autotune.config.study import TrainingConfig, TrialConfig
from autotune.feasibility import MemoryBudget, check_layout
from autotune.landscape import LandscapeGroup, Measurement, load_landscape, shipped_landscape
from autotune.layout import Layout
from autotune.models.memory_uncertainty import FitVerdict

LANDSCAPES = ("vtrain_a100_single_node.csv", "aurora_pvc_70b.csv")


def default_budget(group: LandscapeGroup) -> MemoryBudget:
    """What a study of this group's model on its cluster checks with default settings."""
    training = TrainingConfig(global_batch=group.global_batch, dtype=group.dtype)
    return MemoryBudget.for_study(group.cluster, training, TrialConfig())


def judged(name: str) -> list[tuple[LandscapeGroup, Measurement, FitVerdict, bool]]:
    """(group, row, verdict, excluded on memory by check_layout) for every row of a file."""
    out = []
    for group in load_landscape(shipped_landscape(name)):
        budget = default_budget(group)
        for m in group.measurements:
            fit = budget.verdict(group.model, m.layout)
            reasons = check_layout(m.layout, group.model, memory=budget)
            out.append((group, m, fit.verdict, any(r.code == "memory" for r in reasons)))
    return out


@pytest.mark.parametrize("name", LANDSCAPES)
def test_no_measured_ok_row_is_excluded_at_default_settings(name: str) -> None:
    rows = judged(name)
    ok = [(g, m, v, ex) for g, m, v, ex in rows if m.status == "ok"]
    assert ok, name
    excluded = [f"{g.name} {m.layout.key()}" for g, m, _, ex in ok if ex]
    assert excluded == []
    # the Reason and the verdict agree: only 'exceeds' is excluded
    assert all(ex == (v is FitVerdict.EXCEEDS) for _, _, v, ex in rows)


def test_aurora_row_that_ran_at_13_tflops_per_tile_is_kept() -> None:
    # Issue #13: excluded before (predicted 65.4 GiB on a 64 GiB tile), it is the fastest
    # layout of its group: 13.16 hardware TFLOPS per tile, without recompute.
    [group] = [g for g in load_landscape(shipped_landscape("aurora_pvc_70b.csv"))
               if g.name == "auroragpt-70b-96dev-gb6-pp_zero1_torch25"]
    layout = Layout(tp=2, pp=8, dp=6, micro_batch=1, grad_accum=1, zero_stage=1,
                    recompute="none")
    row = group.lookup(layout)
    assert row is not None and row.status == "ok" and group.best() == row
    budget = default_budget(group)
    assert check_layout(layout, group.model, memory=budget) == []
    fit = budget.verdict(group.model, layout)
    assert fit.verdict is FitVerdict.UNCERTAIN and fit.predicted_bytes > budget.usable_bytes
    assert 0.05 < fit.p_fit < 0.95


def test_aurora_oom_rows_are_not_predicted_to_fit() -> None:
    ooms = Counter(v.value for _, m, v, _ in judged("aurora_pvc_70b.csv") if m.status == "oom")
    assert sum(ooms.values()) == 7
    # The largest one is still excluded; none is called safe (the model is optimistic on
    # 2 of them: see docs/models.md), and the rest are uncertain: each costs one short trial.
    assert ooms["exceeds"] >= 1 and ooms["fits"] == 0


@pytest.mark.parametrize(("what", "model", "device", "layout"), [
    ("70B unsharded on one tile", "aurora", "max1550-tile",
     Layout(tp=1, pp=1, dp=1, micro_batch=1, grad_accum=1)),
    ("70B, ZeRO-3 over 4 tiles", "aurora", "max1550-tile",
     Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=1, zero_stage=3, recompute="full")),
    ("175B data-parallel on A100s", "gpt-175b", "a100-80gb",
     Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=1, zero_stage=1, recompute="full")),
    ("1.3B at micro-batch 64 without recompute on an 80 GB A100", "gpt-1.3b", "a100-80gb",
     Layout(tp=1, pp=1, dp=1, micro_batch=64, grad_accum=1, zero_stage=0)),
])
def test_clearly_impossible_layouts_are_still_excluded(what, model, device, layout) -> None:
    aurora = next(g for g in load_landscape(shipped_landscape("aurora_pvc_70b.csv"))
                  if g.model.name == "auroragpt-70b")
    cfg = aurora.model if model == "aurora" else MODEL_PRESETS[model]
    cluster = aurora.cluster.__class__(nodes=1, devices_per_node=layout.world_size,
                                       device=device)
    budget = MemoryBudget.for_study(cluster, TrainingConfig(global_batch=layout.global_batch),
                                    TrialConfig())
    fit = budget.verdict(cfg, layout)
    assert fit.verdict is FitVerdict.EXCEEDS and fit.p_fit < 1e-3, (what, fit)
    assert [r.code for r in check_layout(layout, cfg, memory=budget)] == ["memory"]
