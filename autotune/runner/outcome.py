"""The one place where what a trial did becomes what the study records.

:func:`classify` turns a launcher's :class:`~autotune.launchers.base.LaunchReport` (the
result file plus what the launcher saw: exit code, timeout, cancel, scheduler state) into
an :class:`Outcome`; :attr:`Outcome.state` is the Optuna state it is told as. Infeasible
layouts never reach a launcher; :func:`infeasible` builds their outcome here too, so
every trial state is decided in this module (Optuna's ``_run_trial`` does the same). A trial
of a foreign workload (the user's own program, which writes no result file of autotune's)
is decided beside it, by :func:`autotune.runner.foreign.foreign_outcome`.

==============  =======================  ==========================================
kind            Optuna state             meaning
==============  =======================  ==========================================
complete        COMPLETE (value)         measured ``model_tflops_per_device``
stopped         COMPLETE (value)         measured, but stopped early: hopeless, its
                                         median known to be too slow at the stated
                                         confidence (``trial.early_stop_tolerance``);
                                         a low value to the search, never the best
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

from dataclasses import dataclass
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from autotune.errors import SpecError
from autotune.result_numbers import check_result_numbers

if TYPE_CHECKING:
    from autotune.feasibility import Reason
    from autotune.launchers.base import LaunchReport
    from autotune.trial import TrialResult

__all__ = ["Outcome", "classify", "infeasible", "OUTCOME_KINDS"]

OUTCOME_KINDS = ("complete", "stopped", "oom", "infeasible", "error", "timeout",
                 "interrupted", "node_failure", "killed")
_STATE = {
    "complete": TrialState.COMPLETE, "stopped": TrialState.COMPLETE, "oom": TrialState.PRUNED,
    "infeasible": TrialState.PRUNED, "error": TrialState.FAIL,
    "timeout": TrialState.FAIL, "interrupted": TrialState.FAIL, "killed": TrialState.FAIL,
    "node_failure": TrialState.FAIL,
}
# SLURM job-step states (sacct) that decide the outcome when the trainer wrote no result.
_SLURM_OOM = {"OUT_OF_MEMORY"}
_SLURM_TIMEOUT = {"TIMEOUT", "DEADLINE"}


@dataclass(frozen=True)
class Outcome:
    kind: str
    """One of :data:`OUTCOME_KINDS`."""
    value: float | None = None
    """Measured model TFLOPS per device (``complete`` and ``stopped`` only)."""
    reason: str = ""
    """Why it is not ``complete``: the error text, the infeasibility reasons, ..."""

    @property
    def state(self) -> TrialState:
        return _STATE[self.kind]

    @property
    def retry(self) -> bool:
        """Whether the layout should be measured again later (it was never judged)."""
        return self.kind in ("interrupted", "node_failure", "killed")

    @property
    def node_lost(self) -> bool:
        """A node under the trial died: its launcher's node group is not used again."""
        return self.kind == "node_failure"

    @property
    def infeasible(self) -> bool:
        """Told to the sampler as a violated constraint (learned, never retried)."""
        return self.kind in ("oom", "infeasible")


def infeasible(reasons: list[Reason]) -> Outcome:
    """The outcome of a layout refused before launch."""
    return Outcome("infeasible", reason="; ".join(r.message for r in reasons))


def classify(report: LaunchReport) -> Outcome:
    """Map what a launcher saw to an outcome; the result file wins where it exists."""
    _drop_invalid_result(report)
    if report.workload != "builtin":
        from autotune.runner.foreign import foreign_outcome  # it imports Outcome from here

        return foreign_outcome(report)
    res = report.result
    if report.interrupted:
        return Outcome("interrupted", reason="cancelled by the runner (interrupt or SIGTERM)")
    if report.timed_out:
        return Outcome("timeout", reason=f"killed after {report.elapsed_s:.0f} s (trial timeout)")
    state = (report.scheduler_state or "").upper().split(" ")[0] or None
    if state == "NODE_FAIL" and (res is None or res.status != "ok"):
        # The ranks that survived report the lost peer ("Connection closed by peer"): the
        # node's death is the cause, and the layout was never judged.
        return Outcome("node_failure", reason=f"job step state {report.scheduler_state}")
    if res is not None:
        return _from_result(res)
    if state in _SLURM_OOM:
        return Outcome("oom", reason=f"job step state {state}")
    if state in _SLURM_TIMEOUT:
        return Outcome("timeout", reason=f"job step state {state}")
    if state == "CANCELLED":
        return Outcome("interrupted", reason="job step cancelled (scancel or preemption)")
    why = report.result_error or "no result file: the trial crashed before writing one"
    where = f" (job step state {state})" if state else ""
    code = f", exit code {report.returncode}" if report.returncode is not None else ""
    tail = f"\n{report.stderr_tail}" if report.stderr_tail else ""
    return Outcome("error", reason=f"{why}{where}{code}{tail}")


def _drop_invalid_result(report: LaunchReport) -> None:
    """A result whose numbers cannot be stored (:mod:`autotune.result_numbers`) is no
    result: the report keeps why (``result_error``), the trial is an ``error`` naming the
    field and its value, and nothing of it reaches the database. The loaders already refuse
    such files; this covers results built in memory (a replayed table, a read-back)."""
    if report.result is None:
        return
    try:
        check_result_numbers(report.result.to_dict())
    except SpecError as err:
        report.result, report.result_error = None, f"invalid result: {err}"


def _from_result(res: TrialResult) -> Outcome:
    if res.status == "ok":
        value = res.model_tflops_per_device
        if value is None or not value > 0:
            return Outcome("error", reason=f"status ok but model_tflops_per_device={value!r}")
        # The result file is complete and atomic: a non-zero exit after it (a rank's
        # teardown, say) does not invalidate the measurement; the exit code stays in
        # launch.json (docs/trainer.md, "Failures"; issue 23, G).
        if res.early_stopped:
            return Outcome("stopped", value=float(value),
                           reason=res.early_stop_reason or "stopped early: hopeless")
        return Outcome("complete", value=float(value))
    if res.status == "oom":
        return Outcome("oom", reason=(res.error or "out of memory").strip()[-2000:])
    return Outcome("error", reason=(res.error or "the trainer reported an error").strip()[-4000:])
