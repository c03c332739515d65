"""The memory rule as the study applies it: verdicts, exclusion only beyond the error bar,
measured OOMs moving their siblings, the calibration hook, and the expected throughput the
search ranks by (issue #13, part 1)."""

from __future__ import annotations

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.errors import SpecError
from autotune.feasibility import Constraints, MemoryBudget, check_layout
from autotune.layout import Layout
from autotune.models.memory_uncertainty import FitVerdict
from autotune.planning.candidates import rank_candidates
from autotune.search import Observation, make_strategy, untried
from autotune.spec import parse_study

MODEL = MODEL_PRESETS["gpt-1.3b"]


def constraints(device: str = "a100-40gb", **trial) -> Constraints:
    return Constraints.from_configs(ClusterConfig(nodes=1, devices_per_node=8, device=device),
                                    TrainingConfig(global_batch=64), SearchConfig(),
                                    TrialConfig(**trial))


def dp8(mb: int, recompute: str = "none", zero: int = 2) -> Layout:
    return Layout(tp=1, pp=1, dp=8, micro_batch=mb, grad_accum=8 // mb, zero_stage=zero,
                  recompute=recompute)


def test_only_exceeds_is_excluded_and_the_reason_agrees_with_the_verdict() -> None:
    cons = constraints()
    verdicts = {mb: cons.memory_verdict(dp8(mb), MODEL) for mb in (1, 8)}
    assert verdicts[1].verdict is FitVerdict.FITS and verdicts[1].p_fit > 0.999
    # micro-batch 8 without recompute: predicted ~38 of 38 GiB usable, about even odds
    assert verdicts[8].verdict is FitVerdict.UNCERTAIN and 0.2 < verdicts[8].p_fit < 0.8
    assert cons.check(dp8(8), MODEL) == []
    big = Layout(tp=1, pp=1, dp=1, micro_batch=64, grad_accum=1, zero_stage=0)
    wide = Constraints(world_size=1, global_batch=64, placement=None, memory=cons.memory)
    [reason] = wide.check(big, MODEL)
    assert reason.code == "memory" and "P(fit)" in reason.message
    assert wide.memory_verdict(big, MODEL).verdict is FitVerdict.EXCEEDS


def test_threshold_is_a_study_setting() -> None:
    default = constraints()
    strict, never = constraints(memory_min_p_fit=0.3), constraints(memory_min_p_fit=0.0)
    layout = dp8(8, "full", zero=0)  # P(fit) about 1/4
    assert default.memory_verdict(layout, MODEL).verdict is FitVerdict.UNCERTAIN
    assert strict.memory_verdict(layout, MODEL).verdict is FitVerdict.EXCEEDS
    assert [r.code for r in strict.check(layout, MODEL)] == ["memory"]
    big = dp8(8, zero=0)  # P(fit) ~0: excluded by default, not with a threshold of 0
    assert [r.code for r in default.check(big, MODEL)] == ["memory"]
    assert never.check(big, MODEL) == []
    with pytest.raises(SpecError, match="memory_min_p_fit"):
        TrialConfig(memory_min_p_fit=0.5)
    spec = parse_study({"name": "t", "model": {"preset": "tiny"},
                        "cluster": {"nodes": 1, "devices_per_node": 2, "device": "cpu"},
                        "training": {"global_batch": 4, "dtype": "fp32"},
                        "trial": {"memory_min_p_fit": 0.01}})
    assert Constraints.from_configs(spec.cluster, spec.training, spec.search,
                                    spec.trial).memory.min_p_fit == 0.01  # type: ignore[union-attr]


def test_a_correction_and_its_uncertainty_can_be_passed_in() -> None:
    # The hook for online calibration (issue #13, part 2): measured / predicted and its sd.
    base = constraints().memory
    assert base is not None
    layout = dp8(8)
    plain = base.verdict(MODEL, layout)
    from dataclasses import replace

    low = replace(base, correction=0.8).verdict(MODEL, layout)
    high = replace(base, correction=1.2).verdict(MODEL, layout)
    assert low.p_fit > plain.p_fit > high.p_fit
    assert high.corrected_bytes == int(1.2 * plain.predicted_bytes)
    assert high.predicted_bytes == plain.predicted_bytes
    wide = replace(base, correction=1.2, correction_sigma=0.3).verdict(MODEL, layout)
    assert wide.sigma_bytes > high.sigma_bytes and high.p_fit < wide.p_fit < 0.5


def test_an_oom_on_a_layout_predicted_to_fit_moves_its_siblings() -> None:
    cons = constraints()
    oom = dp8(4)  # predicted to fit, then measured out of memory
    assert cons.memory_verdict(oom, MODEL).verdict is FitVerdict.FITS
    hungrier = dp8(8)  # same shard, larger micro-batch: needs no less memory
    assert cons.memory_verdict(hungrier, MODEL).verdict is FitVerdict.UNCERTAIN
    after = cons.memory_verdict(hungrier, MODEL, ooms=[oom])
    assert after.verdict is FitVerdict.EXCEEDS and after.p_fit == 0 and after.oom == oom.key()
    # A sibling that needs less is not ruled out, but is no longer taken as sure to fit.
    lighter = dp8(2)
    before = cons.memory_verdict(lighter, MODEL)
    conditioned = cons.memory_verdict(lighter, MODEL, ooms=[oom])
    assert before.verdict is FitVerdict.FITS
    assert conditioned.p_fit < before.p_fit and conditioned.verdict is not FitVerdict.EXCEEDS
    # Another shard (tp 2) shares no model state with the OOM: unchanged.
    other = Layout(tp=2, pp=1, dp=4, micro_batch=4, grad_accum=2, zero_stage=2)
    assert cons.memory_verdict(other, MODEL, ooms=[oom]) == cons.memory_verdict(other, MODEL)
    # The search skips the dominated sibling too (dominated_by_oom).
    cands = [oom, hungrier, lighter, dp8(4, "full")]
    history = [Observation(oom, "oom")]
    assert hungrier not in untried(cands, history, skip_oom_dominated=True)
    strategy = make_strategy("cost-model-only", seed=0,
                             predict=lambda lay: float(lay.micro_batch))
    assert strategy.propose(cands, history) == dp8(4, "full")  # mb 8 would rank first


def test_candidates_carry_the_verdict_and_rank_by_expected_throughput() -> None:
    spec = parse_study({"name": "t", "model": {"preset": "gpt-1.3b"},
                        "cluster": {"nodes": 1, "devices_per_node": 8, "device": "a100-40gb"},
                        "training": {"global_batch": 64},
                        "search": {"tp": [1, 2], "pp": [1], "zero_stage": [2],
                                   "recompute": ["none", "full"]}})
    ranked = rank_candidates(spec.model, spec.cluster, spec.training, spec.search,
                             Constraints.from_configs(spec.cluster, spec.training,
                                                      spec.search, spec.trial),
                             profile=spec.profile)
    assert {c.memory_verdict for c in ranked} == {FitVerdict.FITS, FitVerdict.UNCERTAIN}
    expected = [c.expected_tflops for c in ranked]
    assert expected == sorted(expected, reverse=True)
    unsure = next(c for c in ranked if c.memory_verdict is FitVerdict.UNCERTAIN)
    assert unsure.expected_tflops == pytest.approx(unsure.predicted_tflops * unsure.p_fit)
    assert all(check_layout(c.layout, spec.model) == [] for c in ranked)


def test_budget_for_study_and_without_memory_rule() -> None:
    cluster = ClusterConfig(nodes=1, devices_per_node=8, device="a100-40gb")
    budget = MemoryBudget.for_study(cluster, TrainingConfig(global_batch=8, dtype="bf16"),
                                    TrialConfig())
    assert (budget.margin, budget.min_p_fit, budget.correction) == (0.05, 0.025, 1.0)
    assert constraints().structural_only().memory_verdict(dp8(1), MODEL) is None


def test_a_run_moves_its_siblings_the_other_way() -> None:
    # The mirror of an OOM: dp8(8) is uncertain; the sibling that needs no less memory
    # (ZeRO-1 instead of 2) ran, so dp8(8) fits; a run of a lighter sibling (dp8(4))
    # raises dp8(8)'s P(fit) (the shared error lies below dp8(4)'s headroom) without
    # making it sure.
    cons = constraints()
    unsure, heavier = dp8(8), dp8(8, zero=1)
    before = cons.memory_verdict(unsure, MODEL)
    assert before.verdict is FitVerdict.UNCERTAIN and 0.0 < before.p_fit < 1.0
    assert cons.memory_verdict(unsure, MODEL, fits=[heavier]).p_fit == 1.0
    raised = cons.memory_verdict(unsure, MODEL, fits=[dp8(4)])
    assert before.p_fit < raised.p_fit < 1.0
    # Both bounds: the OOM of the heavier one and the run of dp8(4) leave the error
    # between their headrooms.
    both = cons.memory_verdict(unsure, MODEL, ooms=[heavier], fits=[dp8(4)])
    assert 0.0 < both.p_fit < raised.p_fit
    # Another shard shares nothing with the run: unchanged.
    other = Layout(tp=2, pp=1, dp=4, micro_batch=8, grad_accum=2, zero_stage=2)
    assert cons.memory_verdict(unsure, MODEL, fits=[other]) == before
