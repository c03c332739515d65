"""What a trial came to: the :class:`Outcome` enum and a trial's :class:`Verdict`.

:class:`Outcome` carries everything an outcome means, so no module restates it: the
Optuna state it is told as, the constraint value the sampler sees, whether the layout is
measured again later, what the search observes, its label and colour in the report.
:func:`autotune.trial.classify.classify` decides a launched trial's :class:`Verdict` (the
outcome, its value, why); infeasible layouts never reach a launcher and :func:`infeasible`
builds theirs here, so every trial state is decided in these two modules (Optuna's
``_run_trial`` does the same in one).

==============  =======================  ==========================================
outcome         Optuna state             meaning
==============  =======================  ==========================================
complete        COMPLETE                 measured; value = model TFLOPS per device
stopped         PRUNED                   early-stopped as hopeless: its measurement is
                                         a low value to the search, never the best; it
                                         keeps its value and per-step values
                                         (:mod:`autotune.storage.values`)
oom             PRUNED + constraint > 0  ran out of memory: infeasible, and its more
                                         memory-hungry siblings are not launched
infeasible      PRUNED + constraint > 0  refused by the feasibility check, never ran
error           FAIL                     the trainer failed (traceback in ``reason``)
timeout         FAIL                     killed at the per-trial timeout (or, a foreign
                                         program, when it made no progress)
interrupted     FAIL                     cancelled (Ctrl-C, SIGTERM): retried later
node_failure    FAIL                     a node of the step died (the scheduler says
                                         ``NODE_FAIL``): retried on healthy nodes
killed          FAIL                     the runner died before recording (its claim's
                                         lease ran out: :mod:`autotune.storage.claims`
                                         repairs it): retried later
==============  =======================  ==========================================

An execution's ``measurements`` row carries ``running`` from its claim until the outcome
replaces it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.trial import TrialState

    from autotune.feasibility import Reason

__all__ = ["Outcome", "StopReason", "Verdict", "OomSignature", "infeasible", "OUTCOME_KINDS",
           "find_oom_signature"]


class Outcome(str, Enum):
    """What a trial came to, with all it means (module docstring's first table; each
    member's meaning is one row of :data:`_MEANING` below).

    A ``str`` enum: a member equals its stored value (``Outcome.OOM == "oom"``), which is
    what the ``measurements`` row and the trial's ``outcome`` attribute hold.
    """

    COMPLETE = "complete"
    STOPPED = "stopped"
    OOM = "oom"
    INFEASIBLE = "infeasible"
    ERROR = "error"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    NODE_FAILURE = "node_failure"
    KILLED = "killed"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @property
    def state(self) -> TrialState:
        """The Optuna state the trial is told as (Optuna imported here only: the trainer
        reads this package without it)."""
        from optuna.trial import TrialState

        return TrialState[_MEANING[self].state]

    @property
    def constraint(self) -> float | None:
        """The constraint value the sampler is told (> 0: violated; ``None``: none stored)."""
        return _MEANING[self].constraint

    @property
    def infeasible(self) -> bool:
        """Told to the sampler as a violated constraint (learned, never retried)."""
        constraint = _MEANING[self].constraint
        return constraint is not None and constraint > 0

    @property
    def retry(self) -> bool:
        """Whether the layout is measured again later (it was never judged)."""
        return _MEANING[self].retry

    @property
    def observed(self) -> str | None:
        """What the search observes (:data:`autotune.search._base.OBSERVATION_STATUSES`): ``ok``,
        ``oom`` or ``error``; ``None``: the trial says nothing about the layout's
        throughput."""
        return _MEANING[self].observed

    @property
    def measured(self) -> bool:
        """The layout ran to a verdict on itself (not refused, not cut short by a cause
        outside it: a cancel, a dead node or runner)."""
        return _MEANING[self].measured

    @property
    def label(self) -> str:
        """The report's readable name."""
        return _MEANING[self].label

    @property
    def short(self) -> str:
        """The name in a plot's cell."""
        return _MEANING[self].short

    @property
    def colour(self) -> str:
        """The report's colour."""
        return _MEANING[self].colour


class StopReason(str, Enum):
    """Why a run (a worker's loop, a scaling sweep) ended: the run summary's
    ``stopped_by``. A ``str`` enum, as :class:`Outcome`: a member equals its value."""

    BUDGET = "budget"
    """The study's ``search.n_trials`` are claimed."""
    EXHAUSTED = "exhausted"
    """Every promising layout was measured."""
    STRATEGY = "strategy"
    """The strategy stopped the search (``search.min_improvement``)."""
    TIMEOUT = "timeout"
    """The run's wall-time budget (``--timeout``)."""
    INTERRUPT = "interrupt"
    """SIGINT (Ctrl-C)."""
    SIGTERM = "sigterm"
    """SIGTERM (a scheduler's walltime, ``scancel``)."""
    NODE_FAILURE = "node_failure"
    """A node of the allocation died."""
    BROKEN_PROGRAM = "broken_program"
    """Trials failed alike (``trial.stop_on_repeated_error``)."""
    FAILED = "failed"
    """A scaling sweep's size failed."""
    CONFIRM_INTERRUPT = "confirm_interrupt"
    """SIGINT or SIGTERM during the confirmation round: the best stays unconfirmed."""
    CONFIRM_TIMEOUT = "confirm_timeout"
    """The wall-time budget ran out in the confirmation round."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclass(frozen=True)
class _Meaning:
    state: str
    """A :class:`optuna.trial.TrialState` name."""
    constraint: float | None
    retry: bool
    observed: str | None
    measured: bool
    label: str
    short: str
    colour: str


_MEANING: dict[Outcome, _Meaning] = {
    Outcome.COMPLETE: _Meaning("COMPLETE", 0.0, False, "ok", True, "complete", "ok",
                               "#2e7d32"),
    Outcome.STOPPED: _Meaning("PRUNED", 0.0, False, "ok", True, "stopped early (hopeless)",
                              "stopped", "#9ccc65"),
    Outcome.OOM: _Meaning("PRUNED", 1.0, False, "oom", True, "out of memory", "OOM",
                          "#c62828"),
    Outcome.INFEASIBLE: _Meaning("PRUNED", 1.0, False, None, False, "infeasible", "infeas.",
                                 "#9e9e9e"),
    Outcome.ERROR: _Meaning("FAIL", None, False, "error", True, "failed", "failed", "#ef6c00"),
    Outcome.TIMEOUT: _Meaning("FAIL", None, False, "error", True, "timed out", "timeout",
                              "#6a1b9a"),
    Outcome.INTERRUPTED: _Meaning("FAIL", None, True, None, False, "interrupted", "interr.",
                                  "#1565c0"),
    Outcome.NODE_FAILURE: _Meaning("FAIL", None, True, None, False, "node failed",
                                   "node lost", "#283593"),
    Outcome.KILLED: _Meaning("FAIL", None, True, None, False, "killed (runner died)", "killed",
                             "#4a148c"),
}
"""What each outcome means, one row each (the module docstring's table)."""


OUTCOME_KINDS: tuple[str, ...] = tuple(o.value for o in Outcome)
"""The stored values, in the table's order."""


@dataclass(frozen=True)
class Verdict:
    """One trial's :class:`Outcome`, with its value and why."""

    kind: Outcome
    value: float | None = None
    """Measured model TFLOPS per device (``complete`` and ``stopped`` only)."""
    reason: str = ""
    """Why it is not ``complete``: the error text, the infeasibility reasons, ..."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Outcome(self.kind))  # a stored string read back

    @property
    def state(self) -> TrialState:
        return self.kind.state

    @property
    def retry(self) -> bool:
        return self.kind.retry

    @property
    def infeasible(self) -> bool:
        return self.kind.infeasible

    @property
    def node_lost(self) -> bool:
        """A node under the trial died: its launcher's node group is not used again."""
        return self.kind is Outcome.NODE_FAILURE


@dataclass(frozen=True)
class OomSignature:
    """A documented out-of-memory text a program prints (the workloads declare theirs)."""

    text: str
    """What the output contains (matched case-sensitively, as printed)."""
    device: str
    source: str
    """Where the text comes from (file and commit, or the specification)."""


def find_oom_signature(text: str, signatures: Sequence[OomSignature]) -> OomSignature | None:
    """The first of ``signatures`` (in their order) that ``text`` holds."""
    if not signatures or not text:
        return None
    if not re.search("|".join(re.escape(s.text) for s in signatures), text):
        return None
    return next(s for s in signatures if s.text in text)


def infeasible(reasons: list[Reason]) -> Verdict:
    """The verdict of a layout refused before launch."""
    return Verdict(Outcome.INFEASIBLE, reason="; ".join(r.message for r in reasons))
