"""The benchmarks measure what ships: every group goes through the feasibility check of a
real study (memory and placement included), and a group whose best it excludes is a
search failure."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from autotune.config.model import MODEL_PRESETS
from autotune.hardware import GiB
from autotune.landscape import LandscapeGroup
from autotune.models.memory import estimate_memory
from autotune.search import make_strategy
from benchmarks._common import replay, study_check, study_constraints
from benchmarks._search_replays import trials_to_hit, until_stop
from tests.search.conftest import synthetic_group


def squeezed(group: LandscapeGroup, keep: float = 0.5) -> LandscapeGroup:
    """``group`` with the small-30m model, on a device just large enough for the ``keep``
    share of its layouts with the smallest predicted peak (at the study's default 5%
    margin). The memory rule excludes only beyond the prediction's error bar (~10%): the
    tiny model's layouts all need about the same memory (the runtime's), the small one's
    differ by almost 3x, so the hungriest are excluded."""
    group = replace(group, model=MODEL_PRESETS["small-30m"])
    peaks = sorted(estimate_memory(group.model, m.layout, dtype=group.dtype,
                                   device=group.cluster.device).peak_bytes
                   for m in group.measurements)
    fits = peaks[int(len(peaks) * keep) - 1]
    return replace(group, cluster=replace(group.cluster, memory_gb=fits / 0.95 / GiB * 1.0001))


def test_the_check_is_the_studys_at_default_settings() -> None:
    group = synthetic_group()
    c = study_constraints(group)
    assert c.world_size == 8 and c.global_batch == 16
    assert c.memory is not None and c.memory.margin == 0.05
    assert c.placement is not None and not c.placement.allow_tp_across_nodes
    assert study_check(group).ok_excluded == 0  # the tiny model fits the host


def test_excluded_rows_the_best_and_the_loss() -> None:
    group = squeezed(synthetic_group())
    check = study_check(group)
    constraints = study_constraints(group)
    out = [m for m in group.ok() if constraints.check(m.layout, group.model)]
    assert 0 < check.ok_excluded == len(out) < len(group.ok())
    assert set(check.reasons) == {"memory"}
    best = group.best()
    assert check.best_excluded == (best.layout in check.excluded)
    kept = max(m.model_tflops_per_device for m in group.ok() if m.layout not in check.excluded)
    assert check.loss == pytest.approx(1 - kept / best.model_tflops_per_device)
    assert check.to_dict().keys() >= {"ok_excluded", "best_excluded", "loss"}


def test_a_group_whose_best_is_excluded_is_a_search_failure() -> None:
    group = squeezed(synthetic_group(n_good=3))
    check = study_check(group)
    assert check.best_excluded  # the fastest layout needs the most memory here
    for name in ("default", "random", "grid"):
        assert trials_to_hit(make_strategy(name, seed=0), group, 0.02, check=check) is None
        run = until_stop(make_strategy(name, seed=0), group, 10, 0.02, check)
        assert run["success"] is False
    # The replay only ever offers what the study would: no excluded layout is proposed.
    proposed = [o.layout for o in replay(make_strategy("grid", seed=0), group, check)]
    assert proposed and not set(proposed) & set(check.excluded)


def test_both_jsons_report_the_check(bench, accuracy, tmp_path) -> None:
    from tests.search.test_harness import _vtrain_csv

    csv, rows = _vtrain_csv(tmp_path)
    acc, search = tmp_path / "acc.json", tmp_path / "search.json"
    args = ["--landscape", str(csv)]
    assert accuracy.main([*args, "--json", str(acc)]) == 0
    assert bench.main([*args, "--strategies", "default,random", "--repeats", "2",
                       "--jobs", "1", "--json", str(search)]) == 0
    a, s = json.loads(acc.read_text()), json.loads(search.read_text())
    assert a["ok_rows"] == len(rows) and isinstance(a["ok_excluded"], int)
    [g] = a["groups"]
    assert {"ok_excluded", "best_excluded", "loss", "spearman", "best_in_top3"} <= set(g)
    [g] = s["groups"]
    assert {"ok_excluded", "best_excluded", "loss", "n_candidates"} <= set(g)
    assert s["ok_rows"] == len(rows) and "ok_excluded" in s
