"""The memory model with a layer profile's measured bytes (issue #13, part 3): the measured
activations replace the analytic count where the profile has the shape and nowhere else,
scale with the layers and micro-batches in flight as the count does, bring their own error
bar, and reach the verdict through the study's budget and the planner."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.feasibility import Constraints, MemoryBudget
from autotune.layout import Layout
from autotune.models import memory as mem
from autotune.models.links import tp_link
from autotune.models.memory_uncertainty import estimate_uncertainty
from autotune.models.profile import LayerMemory, LayerProfile, LayerShape, ProfileEntry
from autotune.plan import plan_study, render_plan
from autotune.spec import parse_study

M = ModelConfig(n_layer=9, hidden=1024, n_head=16, seq_len=1024, vocab_size=51200)
A100 = ClusterConfig(nodes=1, devices_per_node=8, device="a100-80gb")
TP2 = Layout(tp=2, pp=1, dp=1, micro_batch=2, grad_accum=4)


def shape_of(layout: Layout, device: str = "a100-80gb", dtype: str = "bf16",
             model: ModelConfig = M) -> LayerShape:
    return LayerShape.of(model, layout, device=device, dtype=dtype,
                         tp_link=tp_link(layout, A100))


def profile_with(layout: Layout, activation_bytes: float, *, stderr: float | None = 1e6,
                 device: str = "a100-80gb", dtype: str = "bf16", peak: str = "allocated",
                 model: ModelConfig = M) -> LayerProfile:
    """A profile whose one entry measured ``layout``'s layer to hold ``activation_bytes``
    beside its analytic states, as ``autotune profile`` would see it (``rho (S + A)``)."""
    rho = mem.peak_retention(peak)
    layer_bytes = rho * (mem.layer_state_bytes(model, layout, dtype) + activation_bytes)
    memory = LayerMemory(layer_bytes, stderr * rho if stderr is not None else None, peak)
    return LayerProfile((ProfileEntry(shape_of(layout, device, dtype, model), 1e-3,
                                      memory=memory),))


def test_without_the_shape_the_estimate_is_the_analytic_one() -> None:
    analytic = mem.estimate_memory(M, TP2, dtype="bf16", device="a100-80gb")
    assert not analytic.profiled and analytic.activations_sigma_bytes is None
    other_shapes = [profile_with(replace(TP2, micro_batch=4), 1e6),
                    profile_with(TP2, 1e6, device="h100"),
                    profile_with(TP2, 1e6, dtype="fp32"),
                    LayerProfile((ProfileEntry(shape_of(TP2), 1e-3),))]  # time, no memory
    for prof in other_shapes:
        assert mem.estimate_memory(M, TP2, dtype="bf16", device="a100-80gb",
                                   profile=prof) == analytic
    # No device, no lookup: a profile is per device.
    assert not mem.estimate_memory(M, TP2, dtype="bf16", profile=profile_with(TP2, 1e6)
                                   ).profiled


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_measured_term_replaces_the_count_per_layer_and_micro_batch(recompute: Any) -> None:
    """pp = 1: the stage stores L layers of one micro-batch: ``L A`` instead of ``L A_a``;
    the one-layer terms (full recompute's working layer) and everything else unchanged."""
    lay = replace(TP2, recompute=recompute)
    analytic = mem.estimate_memory(M, lay, dtype="bf16", device="a100-80gb")
    a_analytic = mem.stored_layer_bytes(M, lay, "bf16")
    a = 0.6 * a_analytic
    est = mem.estimate_memory(M, lay, dtype="bf16", device="a100-80gb",
                              profile=profile_with(lay, a))
    assert est.profiled
    assert est.activations_bytes - analytic.activations_bytes == pytest.approx(
        M.n_layer * (a - a_analytic), abs=M.n_layer)
    assert est.activations_sigma_bytes == pytest.approx(M.n_layer * 1e6, abs=M.n_layer)
    for term in ("weights_bytes", "grads_bytes", "optimizer_bytes", "logits_bytes",
                 "buffers_bytes", "runtime_bytes"):
        assert getattr(est, term) == getattr(analytic, term), term
    assert est.peak_bytes - analytic.peak_bytes == est.activations_bytes - \
        analytic.activations_bytes


def test_in_flight_micro_batches_scale_the_measured_term_like_the_count() -> None:
    """pp = 2, m = 4: the first stage holds ceil(L/2) layers of 2 micro-batches in flight;
    ZeRO-1 over dp = 2 shards the states but not the activations."""
    lay = Layout(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=4, zero_stage=1)
    a = 3e6
    prof = profile_with(lay, a)
    first = mem._stage_estimate(M, lay, "bf16", "first", "a100-80gb",
                                mem.measured_layer_activation(M, lay, dtype="bf16",
                                                              device="a100-80gb",
                                                              profile=prof))
    assert first.activations_bytes == pytest.approx(math.ceil(9 / 2) * 2 * a, abs=10)
    est = mem.estimate_memory(M, lay, dtype="bf16", device="a100-80gb", profile=prof)
    assert est.profiled


def test_cpu_resident_set_is_divided_by_the_allocator_retention() -> None:
    """On CPU the measured peak is the resident set: ``B = 1.15 (S + A)``, as the model
    itself charges peak RSS; the split recovers ``A`` and the model reproduces ``B``."""
    lay = replace(TP2, grad_accum=1)
    a = 2e6
    prof = profile_with(lay, a, device="cpu", dtype="fp32", peak="rss")
    got = mem.measured_layer_activation(M, lay, dtype="fp32", device="cpu", profile=prof)
    assert got is not None and got.retention == mem.CPU_ALLOCATOR_OVERHEAD
    assert got.activation_bytes == pytest.approx(a, rel=1e-9)
    assert got.sigma_bytes == pytest.approx(1e6, rel=1e-9)
    one, three = (mem.estimate_memory(replace(M, n_layer=n), lay, dtype="fp32", device="cpu",
                                      profile=prof) for n in (1, 3))
    analytic_buffers = (three.buffers_bytes - one.buffers_bytes) / 2
    # per layer: the measured B, plus the buffers the model charges per layer (as before)
    slope = (three.peak_bytes - one.peak_bytes) / 2
    assert slope == pytest.approx(prof.entries[0].memory.layer_bytes  # type: ignore[union-attr]
                                  + mem.CPU_ALLOCATOR_OVERHEAD * analytic_buffers, rel=1e-6)


def test_a_measurement_below_the_analytic_states_is_not_used() -> None:
    """``B < rho S``: the stack holds less than the model's states; nothing is learnt about
    the activations, which keep the count."""
    prof = profile_with(TP2, -1e6)
    got = mem.measured_layer_activation(M, TP2, dtype="bf16", device="a100-80gb",
                                        profile=prof)
    assert got is not None and not got.usable
    assert mem.estimate_memory(M, TP2, dtype="bf16", device="a100-80gb", profile=prof) == \
        mem.estimate_memory(M, TP2, dtype="bf16", device="a100-80gb")


def test_the_error_bar_of_the_term_is_the_measured_one() -> None:
    """The activations' sd: the profile's error bar (times the layers stored) in place of
    the 10% the count may leave out; one layer's working set stays in quadrature."""
    a = mem.stored_layer_bytes(M, TP2, "bf16")
    one_layer = mem.layer_activation_bytes(M, TP2, "bf16")
    sds = {}
    for stderr in (0.0, 5e6, None):
        est = mem.estimate_memory(M, TP2, dtype="bf16", device="a100-80gb",
                                  profile=profile_with(TP2, a, stderr=stderr))
        terms = dict(estimate_uncertainty(M, TP2, est, dtype="bf16",
                                          device="a100-80gb").terms)
        sds[stderr] = terms["activations"]
    assert sds[0.0] == one_layer
    assert sds[5e6] == int(math.hypot(M.n_layer * 5e6, one_layer))
    analytic = mem.estimate_memory(M, TP2, dtype="bf16", device="a100-80gb")
    # without an error bar, the analytic rule (10% of the stored bytes)
    assert sds[None] == dict(estimate_uncertainty(M, TP2, analytic, dtype="bf16",
                                                  device="a100-80gb").terms)["activations"]


def test_the_budget_uses_it_and_composes_with_a_correction() -> None:
    cons = Constraints.from_configs(A100, TrainingConfig(global_batch=8), SearchConfig(),
                                    TrialConfig())
    prof = profile_with(TP2, 0.5 * mem.stored_layer_bytes(M, TP2, "bf16"), stderr=0.0)
    with_prof = Constraints.from_configs(A100, TrainingConfig(global_batch=8), SearchConfig(),
                                         TrialConfig(), profile=prof)
    assert cons.memory is not None and with_prof.memory is not None
    plain, measured = cons.memory_verdict(TP2, M), with_prof.memory_verdict(TP2, M)
    assert plain is not None and measured is not None
    assert not plain.profiled and measured.profiled
    assert measured.predicted_bytes < plain.predicted_bytes
    assert measured.sigma_bytes < plain.sigma_bytes  # a measured error bar of 0
    corrected = replace(with_prof.memory, correction=1.2, correction_sigma=0.05)
    v = corrected.verdict(M, TP2)
    assert v.profiled and v.predicted_bytes == measured.predicted_bytes
    assert v.corrected_bytes == int(1.2 * measured.predicted_bytes)


def test_measured_activations_move_a_layout_across_the_capacity() -> None:
    """A layout the count puts beyond the device (P(fit) ~1%) is likely to fit with a
    quarter of the counted activations measured (~84%)."""
    small_vocab = replace(M, vocab_size=8192)  # activations, not logits, dominate
    big = Layout(tp=1, pp=1, dp=1, micro_batch=16, grad_accum=1)
    budget = MemoryBudget(capacity_bytes=8 * 2**30, dtype="bf16", device="a100-80gb")
    assert budget.verdict(small_vocab, big).verdict.value == "exceeds"
    prof = profile_with(big, 0.25 * mem.stored_layer_bytes(small_vocab, big, "bf16"),
                        stderr=0.0, model=small_vocab)
    kept = replace(budget, profile=prof).verdict(small_vocab, big)
    assert kept.verdict.value != "exceeds" and kept.p_fit > 0.5


def test_plan_marks_the_rows_whose_memory_used_the_profile(tmp_path: Path) -> None:
    study: dict[str, Any] = {
        "name": "mem", "model": {"n_layer": M.n_layer, "hidden": M.hidden,
                                 "n_head": M.n_head, "seq_len": M.seq_len},
        "cluster": {"nodes": 1, "devices_per_node": 8, "device": "a100-80gb"},
        "training": {"global_batch": 16, "dtype": "bf16"},
        "search": {"tp": [1, 2], "pp": [1], "micro_batch": [1, 2], "zero_stage": [0],
                   "recompute": ["none"]}}
    measured = replace(TP2, dp=4, grad_accum=2)
    path = tmp_path / "prof.json"
    profile_with(measured, 1e6).save(path)
    spec = parse_study({**study, "cluster": {**study["cluster"], "profile": str(path)}})
    result = plan_study(spec, top=100)
    marks = {r.layout.key(): r.memory.profiled for r in result.rows}
    assert marks[measured.key()] and sum(marks.values()) == 1
    rows = json.loads(render_plan(result, "json"))["feasible"]
    assert sum(r["memory"]["profiled"] for r in rows) == 1
    table = render_plan(result, "table")
    assert "layer activation memory: measured for 1 of them" in table and "layer_mem" in table
    csv_rows = list(csv.DictReader(io.StringIO(render_plan(result, "csv"))))
    assert [r["layer_memory"] for r in csv_rows].count("measured") == 1
