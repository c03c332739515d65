"""Every strategy proposes untried candidates only; OOM dominance; the Optuna adapter."""

from __future__ import annotations

import pytest

from autotune.errors import SpecError
from autotune.layout import Layout
from autotune.search import (
    STRATEGIES,
    Observation,
    dominated_by_oom,
    make_strategy,
)
from benchmarks._common import candidates_of
from tests.search.conftest import synthetic_group

FAST = [s for s in STRATEGIES if s != "gp"]


def _predict(lay: Layout) -> float:
    return 10.0 * lay.micro_batch / lay.tp


@pytest.mark.parametrize("name", FAST)
def test_never_proposes_outside_candidates_or_a_repeat(name):
    group = synthetic_group(oom_mb=8)
    candidates = candidates_of(group)
    strategy = make_strategy(name, seed=3, predict=_predict)
    history: list[Observation] = []
    while (lay := strategy.propose(candidates, history)) is not None:
        assert lay in candidates
        assert lay not in {o.layout for o in history}
        m = group.lookup(lay)
        history.append(Observation(lay, m.status, m.model_tflops_per_device))
    # Everything was used up, except what a measured OOM rules out.
    left = set(candidates) - {o.layout for o in history}
    assert all(dominated_by_oom(lay, history) for lay in left)


@pytest.mark.slow
def test_gp_proposes_untried_candidates():
    pytest.importorskip("scipy")
    group = synthetic_group()
    candidates = candidates_of(group)
    strategy = make_strategy("gp", seed=0)
    history: list[Observation] = []
    for _ in range(6):
        lay = strategy.propose(candidates, history)
        assert lay in candidates and lay not in {o.layout for o in history}
        history.append(Observation(lay, "ok", group.lookup(lay).model_tflops_per_device))


def test_oom_dominance():
    oom = Layout(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=4, zero_stage=1, recompute="full")
    hist = [Observation(oom, "oom")]
    bigger = Layout(tp=2, pp=2, dp=2, micro_batch=4, grad_accum=2, zero_stage=1,
                    recompute="full")
    no_recompute = Layout(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=4, zero_stage=1)
    lower_zero = Layout(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=4, zero_stage=0,
                        recompute="full")
    smaller = Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=8, zero_stage=1,
                     recompute="full")
    other_tp = Layout(tp=4, pp=2, dp=1, micro_batch=2, grad_accum=8, zero_stage=1,
                      recompute="full")
    for lay in (bigger, no_recompute, lower_zero):
        assert dominated_by_oom(lay, hist) == oom
    for lay in (smaller, other_tp):
        assert dominated_by_oom(lay, hist) is None
    cands = [oom, bigger, smaller, other_tp]
    strategy = make_strategy("cost-model-only", seed=0, predict=lambda lay: lay.micro_batch)
    assert strategy.propose(cands, hist) == other_tp  # bigger is skipped
    assert make_strategy("random", seed=0).propose([bigger], hist) == bigger  # baseline


def test_default_starts_with_the_cost_models_favourite(group):
    candidates = candidates_of(group)
    first = make_strategy("default", seed=0, predict=_predict).propose(candidates, [])
    assert first == max(candidates, key=_predict)


def test_unknown_strategy_and_missing_cost_model():
    with pytest.raises(SpecError, match="allowed"):
        make_strategy("bogus", seed=0)
    with pytest.raises(SpecError, match="cost model"):
        make_strategy("cost-model-only", seed=0, predict=None)
