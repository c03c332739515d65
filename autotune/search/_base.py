"""The strategy interface: candidates and history in, the next layout to measure out.

A strategy never launches anything and never sees a launcher or a study. It is given

* ``candidates``: the feasible layouts of the space, in plan order (:func:`plan_order`;
  every layout it may propose), and
* ``history``: what was measured so far, one :class:`Observation` per layout tried (or
  pending: launched and not yet finished),

and returns one layout of ``candidates`` that is not in ``history`` and not dominated by a
measured OOM (strategies that use the rule), or ``None`` when nothing is left. A strategy
may also decide to stop while candidates are left (the default strategy when the expected
improvement is small); it then returns ``None`` too and says why in
:attr:`Strategy.stop`, so callers that only need "is there a next layout" stay unchanged.
The same objects drive the real Optuna study (:mod:`autotune.runner.study`) and the
benchmark (``benchmarks/search_efficiency.py``), so what is benchmarked is what ships.

**Plan order** is the layouts' own order (:class:`~autotune.layout.Layout` compares field
by field): tp, then pp, micro-batch, ZeRO stage, recompute and sequence parallelism,
ascending (``"full"`` before ``"none"`` before ``"selective"``, without SP before
with); within one study dp and grad_accum follow from those. It does not depend on
how the study file lists its axes, on how a replayed table orders its rows, or on what
the cost model predicts: strategies that rank by prediction (``cost-model-only``,
``default``) rank themselves and keep plan order among ties, ``grid`` proposes in it,
and the random ones draw from it. A canonical order is what lets the benchmark, which has
no study file, replay exactly the proposals a study makes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from autotune.layout import Layout, needs_no_less_memory

__all__ = ["Observation", "Stop", "Strategy", "Predictor", "FitProbability",
           "OBSERVATION_STATUSES", "dominated_by_oom", "untried", "plan_order"]

Predictor = Callable[[Layout], float]
"""Predicted throughput of a layout (model TFLOPS per device; any positive scale), as the
cost model gives it: not weighed by the probability of fitting (:data:`FitProbability`)."""

FitProbability = Callable[[Layout], float]
"""Probability that a candidate fits the device's memory (the memory verdict's ``p_fit``,
conditioned on the study's OOMs and runs). Kept apart from :data:`Predictor`: a layout that ran
fitted, so what it measured is a residual against the prediction alone, while a trial
not yet run is worth its throughput only with this probability (an OOM gives nothing).
Asked anew at every proposal: it changes as the study measures."""

OBSERVATION_STATUSES: tuple[str, ...] = ("ok", "oom", "error", "pending")


@dataclass(frozen=True)
class Observation:
    """One layout the study has tried: ``value`` is the measured model TFLOPS per device
    (``status == "ok"`` only); ``oom`` ran out of memory; ``error`` failed otherwise;
    ``pending`` is launched and not finished (never proposed again)."""

    layout: Layout
    status: str
    value: float | None = None

    def __post_init__(self) -> None:
        if self.status not in OBSERVATION_STATUSES:
            raise ValueError(f"Observation.status: got {self.status!r}; allowed: "
                             f"{', '.join(OBSERVATION_STATUSES)}")


@dataclass(frozen=True)
class Stop:
    """A strategy's decision to propose nothing more although untried candidates remain."""

    reason: str
    """One line for people, e.g. ``expected improvement 0.31% < 1% after 6 trials``."""
    judged: int
    """Finished trials (ok, oom, error; not pending) the decision was based on."""


def plan_order(layouts: Iterable[Layout]) -> list[Layout]:
    """``layouts`` in plan order (module docstring), the order every strategy is given.

    >>> lays = [Layout(tp=2, pp=1, dp=1, micro_batch=1, grad_accum=2),
    ...         Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=1, recompute="none"),
    ...         Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=1, recompute="full")]
    >>> [lay.key() for lay in plan_order(lays)]
    ['tp1-pp1-dp2-mb1-ga1-z0-full', 'tp1-pp1-dp2-mb1-ga1-z0-none', 'tp2-pp1-dp1-mb1-ga2-z0-none']
    """
    return sorted(layouts)


def dominated_by_oom(layout: Layout, history: Iterable[Observation]) -> Layout | None:
    """The measured OOM layout that ``layout`` needs no less memory than, if any."""
    for obs in history:
        if obs.status == "oom" and needs_no_less_memory(layout, obs.layout):
            return obs.layout
    return None


def untried(candidates: Sequence[Layout], history: Sequence[Observation], *,
            skip_oom_dominated: bool) -> list[Layout]:
    """Candidates not yet tried (nor pending), in plan order."""
    tried = {obs.layout for obs in history}
    ooms = [obs for obs in history if obs.status == "oom"]
    out = []
    for lay in candidates:
        if lay in tried:
            continue
        if skip_oom_dominated and ooms and dominated_by_oom(lay, ooms) is not None:
            continue
        out.append(lay)
    return out


class Strategy(ABC):
    """Proposes the next layout to measure. One instance serves one study (it may keep
    state between calls, but the history passed in is the truth: a resumed study passes
    the full history to a fresh instance)."""

    name: str = "abstract"
    skip_oom_dominated: bool = True
    """Whether layouts needing no less memory than a measured OOM are skipped."""

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self.stop: Stop | None = None
        """Why the last :meth:`propose` returned ``None`` with candidates left, else ``None``
        (``None`` from :meth:`propose` with no stop: every candidate is used up)."""

    def propose(self, candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout | None:
        """The next layout to measure, or ``None`` when every candidate is used up or the
        strategy stops early (then :attr:`stop` says why).

        ``candidates`` must be in plan order (:func:`plan_order`): the runner and the
        benchmark both pass them so, and a strategy's proposals for the same candidates and
        history must not depend on who asks (``tests/search/test_plan_order.py``)."""
        self.stop = None
        free = untried(candidates, history, skip_oom_dominated=self.skip_oom_dominated)
        if not free:
            return None
        choice = self._choose(free, candidates, history)
        if isinstance(choice, Stop):
            self.stop = choice
            return None
        if choice not in free:  # a bug in a strategy must never launch a repeat
            raise RuntimeError(f"strategy {self.name!r} proposed {choice}, which is not an "
                               "untried candidate")
        return choice

    def propose_sequence(self, candidates: Sequence[Layout], history: Sequence[Observation],
                         k: int) -> list[Layout]:
        """The next ``k`` proposals at most, each made with the earlier ones pending (what
        this strategy would propose next if other workers claimed them first), ending where
        :meth:`propose` returns ``None`` (:attr:`stop` then says why). A strategy whose
        proposals can be ranked in one pass overrides it; this is the definition."""
        out: list[Layout] = []
        seen = list(history)
        while len(out) < k:
            nxt = self.propose(candidates, seen)
            if nxt is None:
                break
            out.append(nxt)
            seen.append(Observation(nxt, "pending"))
        return out

    @abstractmethod
    def _choose(self, free: list[Layout], candidates: Sequence[Layout],
                history: Sequence[Observation]) -> Layout | Stop:
        """Pick one of ``free`` (non-empty, plan order), or :class:`Stop` the search."""
