"""A worker's next few proposals, for when other workers race it for the same layout.

Workers of one study read the same history, and a strategy's proposal is a function of
the history (:meth:`autotune.search.Strategy.propose`), so they all propose the same layout;
claimed one at a time, all but one would lose the race and read the study again.
:func:`next_proposals` lists what the
strategy would propose if each earlier proposal were claimed by another worker (pending),
and the runner passes the list to one claim, which takes the first still free
(:func:`autotune.storage.claims.claim_first`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autotune.layout import Layout
from autotune.search import Observation, Strategy

__all__ = ["next_proposals"]


def next_proposals(strategy: Strategy, plan: Sequence[Layout], observed: Sequence[Observation],
                   first: Layout, n: int, *,
                   admissible: Callable[[Layout], bool]) -> list[Layout]:
    """``first`` and the strategy's next proposals, ``n`` at most: each proposed with the
    earlier ones pending. One that is not ``admissible`` (infeasible, or needing no less
    memory than an OOM) is left out, to be judged when it is proposed first; after ``2 n``
    such, the list ends. The strategy's :attr:`~autotune.search.Strategy.stop` is left as
    ``first``'s proposal set it (the caller decided on it)."""
    out = [first]
    stop = strategy.stop
    # Enough for n - 1 admissible ones after up to 2 n left out (the loop below), proposed
    # in one go: a strategy that ranks in one pass scores the layouts once, not n times.
    sequence = strategy.propose_sequence(plan, [*observed, Observation(first, "pending")],
                                         3 * n) if n > 1 else []
    left_out = 0
    for nxt in sequence:
        if len(out) >= n or left_out > 2 * n:
            break
        if admissible(nxt):
            out.append(nxt)
        else:
            left_out += 1
    strategy.stop = stop
    return out
