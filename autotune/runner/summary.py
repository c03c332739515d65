"""What one worker's run, and the run of a study, end with (:class:`RunSummary`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from autotune.storage import AnyTrial
from autotune.trial.outcome import StopReason

__all__ = ["RunSummary"]


@dataclass
class RunSummary:
    measured: int = 0
    """Trials this worker launched."""
    infeasible: int = 0
    stopped_by: StopReason = StopReason.BUDGET
    """``budget``, ``timeout``, ``exhausted``, ``strategy`` (it stopped early: see
    ``stop_reason``), ``broken_program`` (trials failed alike: :mod:`autotune.runner.
    stop_early`; ``stop_reason`` has the error line and the trial folders), ``interrupt``,
    ``sigterm``, ``confirm_interrupt`` or ``confirm_timeout`` (Ctrl-C or the wall-time
    limit in the confirmation round: :func:`autotune.runner.study.run_study`), or
    ``node_failure`` (a node of this
    worker's group died; ``stop_reason`` says which; with several groups, only when every
    group lost one)."""
    stop_reason: str | None = None
    """With ``strategy``: the strategy's reason, e.g. ``expected improvement 0.31% < 1%
    after 6 trials (14 layouts untried)``."""
    best: FrozenTrial | None = None
    trials: Sequence[AnyTrial] = field(default_factory=list)
    """The study's trials at the end, each with the attributes of
    :data:`~autotune.storage.judged.SUMMARY_KEYS` (a narrow read; ``best`` is whole)."""
    confirmation: dict[str, Any] | None = None
    """The confirmation round's record when this run made or read it
    (:func:`autotune.runner.confirm.confirmation_record`); ``best`` is then its winner."""
