"""The planner: ranking, exclusions, output formats, speed, and the shipped study files."""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config.study import SearchConfig
from autotune.errors import SpecError
from autotune.feasibility import Constraints
from autotune.hardware import GPU_SPEED_SD
from autotune.models.stragglers import straggler_factor
from autotune.planning.band import tflops_bands
from autotune.planning.candidates import Candidate, partition_space, rank_layouts
from autotune.planning.plan import PlanResult, plan_study, render_plan
from autotune.planning.space import enumerate_layouts
from autotune.spec import load_study, parse_study

REPO = Path(__file__).resolve().parents[1]
STUDIES = sorted((REPO / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_shipped_studies_load_and_plan_non_empty(path: Path) -> None:
    result = plan_study(load_study(path), top=5)
    assert result.n_feasible > 0 and result.rows
    assert sum(e.count for e in result.excluded) == result.n_layouts - result.n_feasible


def test_ranked_best_first_and_every_row_passes_the_check() -> None:
    spec = load_study(REPO / "studies" / "lrz_gpt18.4b.yaml")
    result = plan_study(spec, top=1000)
    # Ranked by expected throughput: predicted TFLOPS times the probability of fitting.
    expected = [r.step.model_tflops_per_device * r.p_fit for r in result.rows]
    assert expected == sorted(expected, reverse=True)
    assert {r.memory_verdict.value for r in result.rows} <= {"fits", "uncertain"}
    assert [r.rank for r in result.rows] == list(range(1, len(result.rows) + 1))
    cons = Constraints.from_configs(spec.cluster, spec.training, spec.search, spec.trial)
    assert all(cons.check(r.layout, spec.model) == [] for r in result.rows)
    assert len(result.rows) == result.n_feasible


def test_175b_on_1024_devices_plans_in_under_a_second() -> None:
    spec = load_study(REPO / "studies" / "lrz_gpt175b.yaml")
    # The 1,760 layouts of the study before it searched selective recompute and sequence
    # parallelism (4,950 with them: docs/models.md, the 175B study with the new axes).
    spec = replace(spec, search=replace(spec.search, recompute=("none", "full"),
                                        sequence_parallel=(False,)))
    plan_study(spec, top=20)  # warm imports
    start = time.perf_counter()
    result = plan_study(spec, top=20)
    elapsed = time.perf_counter() - start
    assert result.world_size == 1024 and result.n_feasible > 0
    assert elapsed < 1.0, elapsed
    assert {e.code for e in result.excluded} >= {"memory", "tp_heads"}


def _ranked(result: PlanResult) -> list[Candidate]:
    """The study's whole ranking (the band is over every candidate, not the top rows)."""
    spec = load_study(REPO / "studies" / "lrz_gpt175b.yaml")
    constraints = Constraints.from_configs(spec.cluster, spec.training, spec.search,
                                           spec.trial, profile=spec.profile)
    feasible, _ = partition_space(spec.model, spec.cluster, spec.training, spec.search,
                                  constraints)
    ranked = rank_layouts(spec.model, spec.cluster, feasible, dtype=spec.training.dtype,
                          profile=spec.profile, constraints=constraints)
    assert len(ranked) == result.n_feasible
    return ranked


def test_render_table_csv_json() -> None:
    result = plan_study(load_study(REPO / "studies" / "lrz_gpt175b.yaml"), top=3)
    table = render_plan(result, "table")
    assert "rank" in table and result.rows[0].layout.key() in table
    rows = list(csv.DictReader(io.StringIO(render_plan(result, "csv"))))
    assert len(rows) == 3 and rows[0]["layout"] == result.rows[0].layout.key()
    assert float(rows[0]["model_tflops_per_device"]) > 0
    data = json.loads(render_plan(result, "json"))
    assert data["n_feasible"] == result.n_feasible and len(data["feasible"]) == 3
    assert {"code", "count", "example"} <= set(data["excluded"][0])
    # Every predicted throughput carries its 90% band: the search's posterior interval on
    # the study's device (a Max 1550: no validation covers it, the widest scale), its
    # upper end at the tile's BF16 peak.
    bands = tflops_bands({c.layout: c.predicted_tflops for c in _ranked(result)},
                         layouts=[r.layout for r in result.rows], device="max1550-tile",
                         ceiling=419.0)
    for row, csv_row, js in zip(result.rows, rows, data["feasible"], strict=True):
        lo, hi = row.tflops_band or (0.0, 0.0)
        assert lo < row.step.model_tflops_per_device < hi
        assert (lo, hi) == pytest.approx(bands[row.layout]) and hi == 419.0
        assert float(csv_row["model_tflops_band_low"]) == pytest.approx(lo, abs=1e-4)
        assert js["model_tflops_band"] == pytest.approx([lo, hi])
    assert "90% band" in table
    with pytest.raises(SpecError):
        render_plan(result, "xml")
    with pytest.raises(SpecError):
        plan_study(load_study(REPO / "studies" / "cpu_demo.yaml"), top=0)


def test_plan_shows_memory_verdicts_and_probabilities() -> None:
    result = plan_study(load_study(REPO / "studies" / "lrz_gpt175b.yaml"), top=2000)
    counts = dict(result.memory_verdicts)
    assert set(counts) == {"fits", "uncertain", "exceeds"} and counts["uncertain"] > 0
    assert counts["fits"] + counts["uncertain"] == result.n_feasible
    memory = next(e for e in result.excluded if e.code == "memory")
    assert counts["exceeds"] == memory.count and "P(fit)" in memory.example
    table = render_plan(result, "table")
    assert (f"{counts['fits']} fits, {counts['uncertain']} uncertain, "
            f"{counts['exceeds']} exceeds") in table
    assert "uncertain " in table and "%" in table
    rows = list(csv.DictReader(io.StringIO(render_plan(result, "csv"))))
    assert {r["memory_verdict"] for r in rows} == {"fits", "uncertain"}
    assert all(0.0 < float(r["p_fit"]) <= 1.0 for r in rows)
    data = json.loads(render_plan(result, "json"))
    assert data["memory_verdicts"] == counts and data["memory_min_p_fit"] == 0.025
    row = data["feasible"][0]
    assert row["memory_verdict"] in ("fits", "uncertain") and 0 < row["p_fit"] <= 1
    assert row["peak_memory_sigma_bytes"] > 0


def _study(tp, pp, mb, zero, rc, nodes, dpn, batch, device, tp_nodes) -> dict:
    return {"name": "prop",
            "model": {"preset": "gpt-1.3b"},
            "cluster": {"nodes": nodes, "devices_per_node": dpn, "device": device},
            "training": {"global_batch": batch, "dtype": "bf16"},
            "search": {"tp": tp, "pp": pp, "micro_batch": mb, "zero_stage": zero,
                       "recompute": rc, "tp_across_nodes": tp_nodes}}


pow2 = st.sampled_from([1, 2, 4, 8, 16])
space = st.builds(
    _study,
    tp=st.lists(pow2, min_size=1, max_size=4, unique=True) | st.just("auto"),
    pp=st.lists(pow2, min_size=1, max_size=4, unique=True) | st.just("auto"),
    mb=st.lists(pow2, min_size=1, max_size=4, unique=True) | st.just("auto"),
    zero=st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=4, unique=True),
    rc=st.lists(st.sampled_from(["none", "full"]), min_size=1, max_size=2, unique=True),
    nodes=st.sampled_from([1, 2, 4]), dpn=st.sampled_from([2, 4, 8]),
    batch=st.sampled_from([8, 16, 64, 96, 256]),
    device=st.sampled_from(["a100-40gb", "h100", "max1550-tile"]),
    tp_nodes=st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space)
def test_property_ranked_layouts_pass_the_check_and_accepted_are_in_the_space(data) -> None:
    spec = parse_study(data)
    result = plan_study(spec, top=10_000)
    cons = Constraints.from_configs(spec.cluster, spec.training, spec.search, spec.trial)
    layouts = enumerate_layouts(spec.search, spec.world_size, spec.training.global_batch)
    in_space = set(layouts)
    for row in result.rows:
        assert cons.check(row.layout, spec.model) == []
        assert row.layout in in_space
    accepted = {lay for lay in layouts if not cons.check(lay, spec.model)}
    assert accepted == {r.layout for r in result.rows}
    # the check accepts nothing outside the space: widen the axes and compare
    wide = SearchConfig(zero_stage=(0, 1, 2, 3), recompute=("none", "full"),
                        tp_across_nodes=spec.search.tp_across_nodes)
    for lay in enumerate_layouts(wide, spec.world_size, spec.training.global_batch):
        if not cons.check(lay, spec.model) and lay not in in_space:
            axes = spec.search
            assert ((axes.tp != "auto" and lay.tp not in axes.tp)
                    or (axes.pp != "auto" and lay.pp not in axes.pp)
                    or (axes.micro_batch != "auto" and lay.micro_batch not in axes.micro_batch)
                    or lay.zero_stage not in axes.zero_stage
                    or lay.recompute not in axes.recompute)


def test_cli_plan_formats_and_usage_errors(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    ok = run_cli("plan", str(REPO / "studies" / "nvidia_h100_gpt1.3b.yaml"), "--top", "2",
                 "--format", "json", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["feasible"]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {preset: tiny}\ncluster: {nodes: -1}\ntraining: {global_batch: 8}\n")
    out = run_cli("plan", str(bad), timeout=120)
    assert out.returncode == 2 and "cluster.nodes" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_cpu_demo_plans_with_dropout() -> None:
    """``model.dropout: 0.1`` on the built-in trainer: the study loads (every launcher
    runs dropout now) and plans, its layouts storing the dropout masks as well."""
    spec = load_study(REPO / "studies" / "cpu_demo.yaml")
    dropped = replace(spec, model=replace(spec.model, dropout=0.1))
    plain, with_dropout = plan_study(spec, top=3), plan_study(dropped, top=3)
    assert with_dropout.n_feasible > 0
    by_key = {r.layout: r for r in plain.rows}
    shared = [r for r in with_dropout.rows if r.layout in by_key]
    assert shared and all(r.memory.activations_bytes > by_key[r.layout].memory.activations_bytes
                          for r in shared)


def test_plan_says_what_the_slowest_device_costs() -> None:
    """A GPU study's header gives the slowdown every kernel carries (the slowest of the
    world's devices); the JSON breakdown has the factor; a CPU study has none."""
    result = plan_study(load_study(REPO / "studies" / "lrz_gpt175b.yaml"), top=2)
    factor = straggler_factor(1024, GPU_SPEED_SD)
    assert all(r.step.straggler_factor == factor for r in result.rows)
    assert (f"slowest device: kernels {100 * (factor - 1):.1f}% longer than on the median "
            "device (the slowest of 1024") in render_plan(result, "table")
    data = json.loads(render_plan(result, "json"))
    assert data["feasible"][0]["step"]["straggler_factor"] == pytest.approx(factor)
    cpu = plan_study(load_study(REPO / "studies" / "cpu_demo.yaml"), top=2)
    assert all(r.step.straggler_factor == 1.0 for r in cpu.rows)
    assert "slowest device" not in render_plan(cpu, "table")


def test_plan_says_why_the_band_is_wide_on_a_device_no_validation_covers() -> None:
    """The Max 1550's band (6-419 TFLOPS on the 175B study) spans the widest scale the
    residual model takes (autotune/models/prediction_spread.py): the header says why; a
    study on a validated device (an A100) has no such line."""
    result = plan_study(load_study(REPO / "studies" / "lrz_gpt175b.yaml"), top=2)
    text = render_plan(result, "table")
    assert ("90% band: no published validation of a step-time model covers max1550-tile"
            in text)
    spec = load_study(REPO / "studies" / "lrz_gpt175b.yaml")
    a100 = replace(spec, cluster=replace(spec.cluster, device="a100-80gb"))
    assert "90% band: no published validation" not in render_plan(plan_study(a100, top=2),
                                                                  "table")
