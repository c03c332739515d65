"""Issue #24: constrained EI per expected second, and the evidence scale of the residual
model's shape terms."""

from __future__ import annotations

import math

import numpy as np

from autotune.layout import Layout
from autotune.models.evidence import evidence_scale
from autotune.search import Observation, TrialSeconds, gain_per_second, make_strategy
from autotune.search._acquisition import seed_scores


def _space() -> list[Layout]:
    return sorted(Layout(tp=t, pp=1, dp=8 // t, micro_batch=m, grad_accum=32 // (8 // t * m))
                  for t in (1, 2, 4, 8) for m in (1, 2, 4))


def _choice(build_s: float) -> Layout | None:
    """The fifth proposal after four seeds, where tp1 is predicted far ahead but its
    memory is doubtful (p_fit 0.05) and the others fit."""
    cands = _space()
    predict = {lay: (200.0 if lay.tp == 1 else 100.0 - lay.tp) for lay in cands}
    strategy = make_strategy("default", seed=0, predict=predict.__getitem__,
                             p_fit=lambda lay: 0.05 if lay.tp == 1 else 1.0,
                             cost=lambda lay: TrialSeconds(build_s, 100.0))
    seeds = [lay for lay in cands if lay.tp == 2]  # measured as predicted
    history = [Observation(lay, "ok", predict[lay]) for lay in seeds[:3]]
    history.append(Observation(next(lay for lay in cands if lay.tp == 4), "ok", 96.0))
    return strategy.propose(cands, history)


def test_a_doubtful_layout_far_ahead_goes_first_where_its_oom_is_cheap() -> None:
    cheap = _choice(build_s=1.0)
    dear = _choice(build_s=1000.0)
    assert cheap is not None and cheap.tp == 1  # an OOM costs 1 s against a 101 s trial
    assert dear is not None and dear.tp != 1  # start-up dominates: the sure layouts first


def test_gain_per_second_weighs_the_gain_by_p_fit_and_the_cost_by_the_outcomes() -> None:
    ei = np.array([0.2, 0.2])
    p = np.array([1.0, 0.25])
    out = gain_per_second(ei, p, np.array([10.0, 10.0]), np.array([90.0, 90.0]),
                          np.array([1.0, 1.0]))
    assert math.isclose(out[0], 0.2 / 100.0)
    assert math.isclose(out[1], 0.25 * 0.2 / (10.0 + 0.25 * 90.0))
    # A layout expected twice as fast as predicted takes half its predicted steps' time.
    fast = gain_per_second(ei[:1], p[:1], np.array([10.0]), np.array([90.0]), np.array([2.0]))
    assert math.isclose(fast[0], 0.2 / 55.0)


def test_the_evidence_keeps_the_shape_terms_off_for_scatter_and_on_for_a_trend() -> None:
    rng = np.random.default_rng(0)
    # Columns: intercept, one axis trend (log2 of an axis value, centred).
    x = np.column_stack([np.ones(8), np.repeat([-1.5, -0.5, 0.5, 1.5], 2)])
    prior_cov = np.diag([1.0, 0.15**2])
    shape = np.array([False, True])
    scatter = -0.2 + rng.normal(0.0, 0.05, 2)  # two close favourites, a common offset
    assert evidence_scale(x[:2], scatter, np.zeros(2), prior_cov, shape, 0.2) == 0.0
    trend = -0.2 + 0.3 * x[:, 1]  # the model is wrong by 35% per doubling of the axis
    assert evidence_scale(x, trend, np.zeros(2), prior_cov, shape, 0.2) > 0.0
    assert evidence_scale(x[:0], trend[:0], np.zeros(2), prior_cov, shape, 0.2) == 1.0


def _sequential(strategy, cands, history, k):  # type: ignore[no-untyped-def]
    """The definition (Strategy.propose_sequence's own loop): propose, mark it pending."""
    from autotune.search._base import Strategy

    return Strategy.propose_sequence(strategy, cands, history, k)


def test_the_default_strategys_sequence_in_one_pass_is_the_sequential_one() -> None:
    # Issue #23: the runner's spread proposals come from one posterior; they must be what
    # proposing one at a time, each earlier one pending, gives: in the seed phase, after it
    # (cost-aware), with an OOM, and up to the stop (min_improvement).
    cands = _space()
    predict = {lay: (200.0 if lay.tp == 1 else 100.0 - lay.tp) * (1 + 0.1 * lay.micro_batch)
               for lay in cands}
    rng = np.random.default_rng(3)
    lengths, stops = [], []
    for n_seen, min_improvement, cost in ((0, None, None), (5, None, 10.0), (6, 0.05, None),
                                          (4, 0.2, 1.0), (4, 0.02, None), (3, 0.01, 1.0)):
        def make(bar: float | None = min_improvement, build: float | None = cost):  # type: ignore[no-untyped-def]
            return make_strategy(
                "default", seed=0, predict=predict.__getitem__,
                p_fit=lambda x: 0.3 if x.tp == 1 else 1.0, min_improvement=bar,
                cost=None if build is None else (lambda x: TrialSeconds(build, 10.0 * x.tp)))
        history = [Observation(lay, "ok", predict[lay] * math.exp(rng.normal(0, 0.2)))
                   for lay in cands[1:1 + n_seen]]
        history.append(Observation(cands[-1], "oom"))
        one, seq = make(), make()
        fast = one.propose_sequence(cands, history, 8)
        slow = _sequential(seq, cands, history, 8)
        assert fast == slow, (n_seen, fast, slow)
        assert (one.stop is None) == (seq.stop is None)
        if one.stop is not None:
            assert seq.stop is not None and one.stop.reason == seq.stop.reason
        lengths.append(len(fast))
        stops.append(one.stop is not None)
    print(lengths, stops)
    assert 8 in lengths and any(stops)


def test_once_a_seed_ran_the_next_is_the_one_that_could_beat_it() -> None:
    # tp1 is predicted 10% ahead of the rest but may not fit (p 0.6); tp2 surely fits.
    # First the best expected throughput (tp2 at 100 against tp1's 0.6 x 110); once tp2
    # ran, only tp1 can beat it: the next seed, though the other tp2 layouts fit surely.
    cands = _space()
    predict = {lay: (110.0 if lay.tp == 1 else 100.0 - lay.tp + lay.micro_batch / 10)
               for lay in cands}
    strategy = make_strategy("default", seed=0, predict=predict.__getitem__,
                             p_fit=lambda lay: 0.6 if lay.tp == 1 else 1.0)
    first = strategy.propose(cands, [])
    assert first is not None and first.tp == 2
    second = strategy.propose(cands, [Observation(first, "ok", predict[first])])
    assert second is not None and second.tp == 1
    # Where nothing untried is predicted above the layouts that ran: expected throughput.
    ran = [Observation(lay, "ok", predict[lay]) for lay in cands if lay.tp == 1]
    third = strategy.propose(cands, ran)
    assert third == max((lay for lay in cands if lay.tp != 1), key=predict.__getitem__)


def test_seed_scores_order() -> None:
    log_mean = np.log(np.array([100.0, 110.0, 105.0, 90.0]))
    log_p = np.log(np.array([1.0, 0.5, 0.9, 1.0]))
    # Before any run: expected throughput (100 > 0.9 x 105 > 90 > 0.5 x 110).
    assert list(np.argsort(-seed_scores(log_mean, log_p, None))) == [0, 2, 3, 1]
    # After the first ran: the gains over it first (0.5 x ln 1.1 = 0.048 > 0.9 x ln 1.05
    # = 0.044), then the rest by expected throughput.
    order = np.argsort(-seed_scores(log_mean, log_p, math.log(100.0)))
    assert list(order) == [1, 2, 0, 3]
