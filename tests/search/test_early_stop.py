"""The default strategy's early stop (``search.min_improvement``, issue #5): never before
the seeds or without a measured value, monotone in the threshold, the same for a fresh
strategy given the same history, and refused where it cannot be honoured."""

from __future__ import annotations

import math

import pytest

from autotune.errors import SpecError
from autotune.layout import Layout
from autotune.search import Observation, make_strategy
from autotune.search._residual import SEED_TRIALS
from autotune.spec import parse_study
from tests.search.conftest import synthetic_group


def _predict(lay: Layout) -> float:
    return 10.0 * lay.micro_batch / lay.tp


def _replay(min_improvement: float | None, *, oom_mb: int | None = None,
            predict=_predict) -> tuple[list[Observation], object]:
    """Measure what the default strategy proposes, from the synthetic table, until it
    proposes nothing; the history and the strategy (its ``stop``)."""
    group = synthetic_group(n_good=2, oom_mb=oom_mb)
    candidates = sorted(group.layouts(), key=lambda lay: lay.key())
    strategy = make_strategy("default", seed=0, predict=predict,
                             min_improvement=min_improvement)
    history: list[Observation] = []
    while (lay := strategy.propose(candidates, history)) is not None:
        m = group.lookup(lay)
        history.append(Observation(lay, m.status, m.model_tflops_per_device))
    return history, strategy


def test_off_or_zero_never_stops_early():
    off, strategy = _replay(None, oom_mb=8)
    assert strategy.stop is None  # None because the candidates are used up
    zero, strategy = _replay(0.0, oom_mb=8)
    assert strategy.stop is None and zero == off  # EI is positive: 0 is the same as off


def test_stops_after_the_seeds_and_not_before():
    history, strategy = _replay(0.99)  # nearly any EI is below 99%: stop at the first chance
    assert len(history) == SEED_TRIALS
    assert strategy.stop is not None and strategy.stop.judged == SEED_TRIALS
    assert strategy.stop.reason.startswith("expected improvement ")
    assert f"< 99% after {SEED_TRIALS} trials" in strategy.stop.reason


def test_no_stop_without_a_measured_value():
    group = synthetic_group()
    candidates = sorted(group.layouts(), key=lambda lay: lay.key())
    failed = [Observation(lay, "error") for lay in candidates[:SEED_TRIALS + 2]]
    strategy = make_strategy("default", seed=0, predict=_predict, min_improvement=0.99)
    assert strategy.propose(candidates, failed) is not None and strategy.stop is None
    # One value to improve on, and the stop applies.
    ran = [*failed, Observation(candidates[-1], "ok", 50.0)]
    assert strategy.propose(candidates, ran) is None
    assert strategy.stop is not None and strategy.stop.judged == len(ran)


def test_a_larger_threshold_stops_no_later_on_the_same_path():
    runs = {m: _replay(m)[0] for m in (None, 0.0005, 0.002, 0.01, 0.05, 0.99)}
    full = runs[None]
    lengths = [len(h) for h in runs.values()]
    assert lengths == sorted(lengths, reverse=True)
    for history in runs.values():
        assert history == full[:len(history)]  # the stop only cuts the path short
    assert len(runs[0.99]) == SEED_TRIALS < len(full)


def test_a_fresh_strategy_with_the_same_history_decides_the_same():
    history, first = _replay(0.002)
    assert first.stop is not None
    group = synthetic_group(n_good=2)
    candidates = sorted(group.layouts(), key=lambda lay: lay.key())
    fresh = make_strategy("default", seed=0, predict=_predict, min_improvement=0.002)
    assert fresh.propose(candidates, list(reversed(history))) is None  # order-free
    assert fresh.stop == first.stop
    # A lower threshold on the same history (a resumed study, option changed) goes on.
    lower = make_strategy("default", seed=0, predict=_predict, min_improvement=1e-6)
    assert lower.propose(candidates, history) is not None and lower.stop is None


def test_other_strategies_refuse_the_option():
    for name in ("cost-model-only", "random", "grid", "tpe"):
        with pytest.raises(SpecError) as info:
            make_strategy(name, seed=0, predict=_predict, min_improvement=0.01)
        assert info.value.field == "search.min_improvement" and repr(name) in str(info.value)
    assert make_strategy("random", seed=0, min_improvement=None).name == "random"


def _doc(**search: object) -> dict:
    return {"model": {"preset": "tiny"}, "cluster": {"devices_per_node": 2},
            "training": {"global_batch": 8}, "search": search}


@pytest.mark.parametrize("value", [1.0, 1, 1.5, -0.01, "1%", True, math.nan, [0.01]])
def test_invalid_values_name_the_field_value_and_range(value):
    with pytest.raises(SpecError) as info:
        parse_study(_doc(min_improvement=value))
    assert info.value.field == "search.min_improvement"
    assert "got" in str(info.value) and ">= 0 and < 1" in str(info.value)


def test_only_the_default_strategy_takes_it():
    with pytest.raises(SpecError) as info:
        parse_study(_doc(strategy="tpe", min_improvement=0.01))
    assert info.value.field == "search.min_improvement" and "'tpe'" in str(info.value)
    assert parse_study(_doc(strategy="tpe", min_improvement=None)).search.min_improvement is None


@pytest.mark.parametrize("value", [None, 0, 0.0, 0.01, 0.5])
def test_valid_values(value):
    assert parse_study(_doc(min_improvement=value)).search.min_improvement == value
    assert parse_study(_doc()).search.min_improvement is None  # off unless asked for
