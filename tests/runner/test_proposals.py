"""A worker racing others passes its next proposals to one claim (issue 23): what the
strategy would propose if each earlier proposal were pending, admissible ones only."""

from __future__ import annotations

from autotune.layout import Layout
from autotune.runner.proposals import next_proposals
from autotune.search import Observation, make_strategy, plan_order

PLAN = plan_order(Layout(tp=tp, pp=1, dp=8 // tp, micro_batch=mb, grad_accum=16 // (8 // tp * mb))
                  for tp in (1, 2, 4, 8) for mb in (1, 2))


def test_the_next_proposals_are_the_strategy_s_with_the_earlier_ones_pending() -> None:
    grid = make_strategy("grid", seed=0)
    observed = [Observation(PLAN[0], "ok", 1.0)]
    first = grid.propose(PLAN, observed)
    assert first == PLAN[1]
    got = next_proposals(grid, PLAN, observed, first, 3, admissible=lambda lay: True)
    assert got == PLAN[1:4]
    # One that is not admissible is left out (judged when proposed first), not counted.
    got = next_proposals(grid, PLAN, observed, first, 3,
                         admissible=lambda lay: lay != PLAN[2])
    assert got == [PLAN[1], PLAN[3], PLAN[4]]
    # Fewer left than asked for: the list ends; the strategy's stop is first's.
    got = next_proposals(grid, PLAN, [Observation(lay, "ok", 1.0) for lay in PLAN[:-2]],
                         PLAN[-2], 5, admissible=lambda lay: True)
    assert got == PLAN[-2:] and grid.stop is None


def test_the_default_strategy_never_lists_a_layout_twice() -> None:
    strategy = make_strategy("default", seed=0)
    first = strategy.propose(PLAN, [])
    assert first is not None
    got = next_proposals(strategy, PLAN, [], first, 8, admissible=lambda lay: True)
    assert len(got) == 8 and len(set(got)) == 8 and set(got) <= set(PLAN)
