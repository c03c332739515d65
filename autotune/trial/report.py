"""What a launcher observed of one trial: the evidence its outcome is decided from.

The launchers fill it (:mod:`autotune.launchers.base`), a workload adds what it read back
(:mod:`autotune.workloads`), and :func:`autotune.trial.classify.classify` decides from it. It
lives here, below all three, so that none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.trial.outcome import Verdict
from autotune.trial.result import TrialResult

__all__ = ["LaunchReport"]


@dataclass
class LaunchReport:
    """What a launcher observed. Classified into an outcome in one place."""

    result: TrialResult | None
    """The trainer's result file, ``None`` if it wrote none (crash, kill)."""
    returncode: int | None
    timed_out: bool = False
    interrupted: bool = False
    """Stopped by :meth:`~autotune.launchers.base.Launcher.cancel` (Ctrl-C, SIGTERM before
    walltime)."""
    scheduler_state: str | None = None
    """E.g. SLURM step state ``COMPLETED``, ``OUT_OF_MEMORY``, ``NODE_FAIL``."""
    stderr_tail: str = ""
    hosts: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    result_error: str | None = None
    """Why a result file present could not be read."""
    workload: str = "builtin"
    """The workload kind that ran (:mod:`autotune.workloads`)."""
    no_progress: bool = False
    """Killed because its workload watch saw no new step in time."""
    no_progress_reason: str = ""
    readback: dict[str, Any] | None = None
    """A foreign workload's summary of what it read back (source, steps, garbage lines)."""
    log_text: str = ""
    """A foreign program's output (the end of stdout and stderr), where an out-of-memory
    signature is looked for; not stored."""
    error_line: str | None = None
    """A foreign program's own last error line (:func:`autotune.workloads.error_line.
    program_error_line`): the cause its failure is stored with."""
    measured_stop: dict[str, Any] | None = None
    """Stopped by the launcher because the workload's watch said it measured enough
    (:meth:`autotune.workloads.base.ProgressWatch.enough`: ``reason`` ``precision``,
    ``hopeless`` or ``cap``, the steps and the precision then): a measurement, not a
    failure."""
    batch: dict[str, Any] | None = None
    """In a batch: ``index``, ``size``, ``lead`` (the directory with the launch's logs),
    ``rerun`` (true when it ran again alone after the launch ended without its result)."""

    verdict: Verdict | None = None
    """The outcome its workload decided, when the workload wrote the trial's result file
    from it (a user's program writes none: :meth:`autotune.workloads.foreign.ForeignWorkload.
    finish`); :func:`autotune.trial.classify.classify` returns it as it is, so that the file
    and the study agree. ``None``: decided from the evidence above. Not stored here (the
    study records it)."""

    def to_dict(self) -> dict[str, Any]:
        return {"returncode": self.returncode, "timed_out": self.timed_out,
                "interrupted": self.interrupted, "scheduler_state": self.scheduler_state,
                "hosts": self.hosts, "elapsed_s": self.elapsed_s,
                "result_error": self.result_error,
                "status": self.result.status if self.result else None,
                "workload": self.workload, "no_progress": self.no_progress,
                "no_progress_reason": self.no_progress_reason or None,
                "readback": self.readback, "error_line": self.error_line,
                "measured_stop": self.measured_stop, "batch": self.batch}
