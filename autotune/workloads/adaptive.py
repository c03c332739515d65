"""Adaptive measurement of a user's program: stop it once its median step is known.

The built-in trainer decides itself when it has timed enough steps
(:class:`autotune.trial.measurement.StopRule`). A user's program cannot: it runs the steps it was
given. So autotune starts it with the step cap (``{train_iters}`` and Megatron's
``--train-iters`` are warm-up + ``trial.max_measure_steps``), follows the steps as they
stream in (the metrics file, or the log lines of :mod:`autotune.workloads.readback`, the
source :func:`~autotune.workloads.readback.read_back` reads afterwards), drops the warm-up
steps, and asks the *same* :class:`~autotune.trial.measurement.StopRule` after each new step.
When it says stop, the launcher stops the program (the local launcher: SIGTERM to its whole
process tree, SIGKILL after a grace; SLURM: ``scancel`` of the step) and the trial is an
``ok`` measurement of the steps it printed, recorded with why it was stopped
(``measured_stop`` in ``report.json``, ``measurement_stop`` in ``result.json``, the trial's
``reason``), never an error or a timeout (:func:`autotune.trial.classify.classify`).

Why a stop is one of three:

* ``precision``: at least ``trial.measure_steps`` steady steps and the median's
  distribution-free interval as narrow as ``trial.measure_precision``;
* ``hopeless``: ``trial.early_stop_tolerance``'s verdict (outcome ``stopped``);
* ``cap``: ``trial.max_measure_steps`` steady steps seen and the program, told to end
  there, still running after :data:`CAP_GRACE_S` (its own step count was larger).

A program whose own step count ends first (a literal ``--steps 5``) exits by itself: its
measurement is what it printed.

>>> from autotune.workloads.readback import StepRecord
>>> class Steps:  # what the watch reads: a StepCounter's interface
...     def __init__(self, times): self.times, self.shown = times, 0
...     @property
...     def steps(self): return self.shown
...     def update(self): self.shown += 1; return True
...     def records(self): return [StepRecord(i + 1, t, "metrics-file")
...                                for i, t in enumerate(self.times[:self.shown])]
>>> rule = StopRule(min_steps=3, cap=10, precision=0.05, confidence=0.95)
>>> watch = MeasuringWatch(Steps([9.0] + [0.30, 0.31, 0.29, 0.30, 0.30, 0.31]), rule=rule,
...                        drop=1, first_step_s=60, no_progress_s=60, expected_steps=11)
>>> [(watch.stalled(), watch.enough()) for _ in range(6)][-1][1] is None  # 5 steady steps
True
>>> watch.stalled(), watch.enough()["reason"], watch.enough()["steps"]
(False, 'precision', 6)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from autotune.trial.measurement import StopRule, relative_precision
from autotune.workloads.base import ProgressWatch
from autotune.workloads.readback import StepRecord

__all__ = ["MeasuringWatch", "CAP_GRACE_S", "STOP_REASONS"]

CAP_GRACE_S = 2.0
"""How long a program that reached the cap may take to end by itself (it was told to end
there) before it is stopped: every step the measurement needs is in, and what is left is
its teardown, which no trial needs (plain DeepSpeed on 2 loaded CPU ranks took over 10 s)."""
STOP_REASONS: tuple[str, ...] = ("precision", "hopeless", "cap")


class _Records(Protocol):
    @property
    def steps(self) -> int: ...

    def update(self) -> bool: ...

    def records(self) -> list[StepRecord]: ...


class MeasuringWatch(ProgressWatch):
    """A :class:`ProgressWatch` that also says when the program measured enough (module
    docstring): ``drop`` warm-up steps are left out, then ``rule`` decides."""

    def __init__(self, counter: _Records, *, rule: StopRule, drop: int, first_step_s: float,
                 no_progress_s: float, expected_steps: int,
                 clock: Callable[[], float] = time.monotonic,
                 cap_grace_s: float | None = None,
                 lock_env: Mapping[str, str] | None = None) -> None:
        super().__init__(counter, first_step_s=first_step_s, no_progress_s=no_progress_s,
                         expected_steps=expected_steps, clock=clock, lock_env=lock_env)
        self.records_of = counter
        self.rule, self.drop = rule, drop
        self.cap_grace_s = CAP_GRACE_S if cap_grace_s is None else cap_grace_s
        self._decided: dict[str, Any] | None = None
        self._cap_seen_at: float | None = None
        self._judged = -1

    def stalled(self) -> bool:
        stalled = super().stalled()
        steady = [r.seconds for r in self.records_of.records()[self.drop:]]
        if self._decided is None and steady and len(steady) != self._judged:
            self._judged = len(steady)
            self._judge(steady)
        if self._cap_seen_at is not None and self._decided is None \
                and self.clock() - self._cap_seen_at >= self.cap_grace_s:
            self._decided = self._stop("cap", steady, None)
        return stalled

    def _judge(self, steady: list[float]) -> None:
        stop, hopeless = self.rule.decide(steady)
        if hopeless is not None:
            self._decided = self._stop("hopeless", steady, hopeless)
        elif stop and len(steady) < self.rule.cap:
            self._decided = self._stop("precision", steady, None)
        elif stop and self._cap_seen_at is None:
            self._cap_seen_at = self.clock()  # the program was told to end here: let it

    def _stop(self, reason: str, steady: list[float], detail: str | None) -> dict[str, Any]:
        precision = relative_precision(steady, self.rule.confidence)
        return {"reason": reason, "steps": len(steady), "dropped": self.drop,
                "precision": precision, "target_precision": self.rule.precision,
                "confidence": self.rule.confidence, "cap": self.rule.cap, "detail": detail}

    def enough(self) -> dict[str, Any] | None:
        return self._decided
