"""The one place a launched trial's outcome is decided: :func:`classify`.

It turns a launcher's :class:`~autotune.trial.report.LaunchReport` into a
:class:`~autotune.trial.outcome.Verdict` for autotune's trainer and for a user's own program
alike: the trainer's result file wins where it exists (first table of
:mod:`autotune.trial.outcome`); a program that writes none is judged from what its workload
read back and from the out-of-memory signatures it declares (data of
:mod:`autotune.workloads.oom_signatures`, handed in):

==================================================  ===========  ==========================
seen                                                outcome      note
==================================================  ===========  ==========================
cancelled by the runner / scheduler ``CANCELLED``   interrupted  retried later
an out-of-memory signature in its output            oom          also when it then hung or
or SLURM ``OUT_OF_MEMORY``                                       timed out (a consequence)
stopped by autotune once measured enough          complete     ``stopped`` when hopeless;
(``measured_stop``: precision, cap, hopeless)                    the scheduler's CANCELLED
                                                                 and the exit signal of the
                                                                 stop are ours, not a crash
wall-clock ``trial.timeout_s`` / SLURM ``TIMEOUT``  timeout
no new step for ``workload.no_progress_s``          timeout      whole tree / step killed
steady-state steps read back and the exit code 0,   complete     value: autotune's score
or every expected step read back
anything else                                       error        the program's own error
                                                                 line, else exit code or
                                                                 signal, what was read,
                                                                 the stderr tail
==================================================  ===========  ==========================
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from autotune.errors import SpecError
from autotune.trial.numbers import check_result_numbers
from autotune.trial.outcome import OomSignature, Outcome, Verdict, find_oom_signature
from autotune.trial.report import LaunchReport

if TYPE_CHECKING:
    from autotune.trial.result import TrialResult

__all__ = ["classify", "storable"]

# SLURM job-step states (sacct) that decide the outcome when the trainer wrote no result.
_SLURM_OOM = {"OUT_OF_MEMORY"}
_SLURM_TIMEOUT = {"TIMEOUT", "DEADLINE"}


def classify(report: LaunchReport, oom_signatures: Sequence[OomSignature] = ()) -> Verdict:
    """Decide what a launcher saw (module docstring); a pure function of the report, which
    it leaves as it is. ``oom_signatures``: the workload's
    (:attr:`autotune.workloads.base.Workload.oom_signatures`).

    A verdict the report carries is returned as it is: the workload decided it when it wrote
    the trial's result file from it (:attr:`LaunchReport.verdict`), and the runner that
    records the trial must read the same one. Otherwise the verdict is decided from
    :func:`storable` ``(report)``, the report the runner records."""
    if report.verdict is not None:
        return report.verdict
    report = storable(report)
    return (_builtin(report) if report.workload == "builtin"
            else _foreign(report, oom_signatures))


def storable(report: LaunchReport) -> LaunchReport:
    """The report as it is classified and recorded: a result whose numbers cannot be stored
    (:mod:`autotune.trial.numbers`) is no result. The copy returned then has none and keeps
    why (``result_error``): the trial is an ``error`` naming the field and its value, and
    nothing of it reaches the database. The loaders already refuse such files; this covers
    results built in memory (a replayed table, a read-back). ``report`` itself when its result
    is storable, absent, or the one its workload wrote with the verdict it carries."""
    if report.result is None or report.verdict is not None:
        return report
    try:
        check_result_numbers(report.result.to_dict())
    except SpecError as err:
        return replace(report, result=None, result_error=f"invalid result: {err}")
    return report


def _step_state(report: LaunchReport) -> str | None:
    return (report.scheduler_state or "").upper().split(" ")[0] or None


def _builtin(report: LaunchReport) -> Verdict:
    """autotune's trainer wrote a result file (or died before it)."""
    res = report.result
    if report.interrupted:
        return Verdict(Outcome.INTERRUPTED,
                       reason="cancelled by the runner (interrupt or SIGTERM)")
    if report.timed_out:
        return Verdict(Outcome.TIMEOUT,
                       reason=f"killed after {report.elapsed_s:.0f} s (trial timeout)")
    state = _step_state(report)
    if state == "NODE_FAIL" and (res is None or res.status != "ok"):
        # The ranks that survived report the lost peer ("Connection closed by peer"): the
        # node's death is the cause, and the layout was never judged.
        return Verdict(Outcome.NODE_FAILURE, reason=f"job step state {report.scheduler_state}")
    if res is not None:
        return _from_result(res)
    if state in _SLURM_OOM:
        return Verdict(Outcome.OOM, reason=f"job step state {state}")
    if state in _SLURM_TIMEOUT:
        return Verdict(Outcome.TIMEOUT, reason=f"job step state {state}")
    if state == "CANCELLED":
        return Verdict(Outcome.INTERRUPTED, reason="job step cancelled (scancel or preemption)")
    why = report.result_error or "no result file: the trial crashed before writing one"
    where = f" (job step state {state})" if state else ""
    code = f", exit code {report.returncode}" if report.returncode is not None else ""
    tail = f"\n{report.stderr_tail}" if report.stderr_tail else ""
    return Verdict(Outcome.ERROR, reason=f"{why}{where}{code}{tail}")


def _foreign(report: LaunchReport, oom_signatures: Sequence[OomSignature]) -> Verdict:
    """A user's program: no result file of its own, so the output's and the scheduler's
    evidence outranks what was read back (second table of the module docstring)."""
    state = _step_state(report)
    tail = f"\n{report.stderr_tail}" if report.stderr_tail else ""
    if report.interrupted:
        return Verdict(Outcome.INTERRUPTED,
                       reason="cancelled by the runner (interrupt or SIGTERM)")
    oom = find_oom_signature(report.log_text, oom_signatures)
    if oom is not None:
        return Verdict(Outcome.OOM, reason=f"out of memory: {oom.text!r} in the output "
                       f"({oom.device}; {oom.source}){tail}"[-2000:])
    if state in _SLURM_OOM:
        return Verdict(Outcome.OOM, reason=f"job step state {state}{tail}"[-2000:])
    measured = _measured_stop(report)
    if measured is not None:
        return measured
    if report.timed_out or state in _SLURM_TIMEOUT:
        why = f"job step state {state}" if state in _SLURM_TIMEOUT else \
            f"killed after {report.elapsed_s:.0f} s (trial timeout)"
        return Verdict(Outcome.TIMEOUT, reason=f"{why}; {_read(report)}")
    if report.no_progress:
        return Verdict(Outcome.TIMEOUT, reason=f"{report.no_progress_reason}: killed with all "
                       f"its processes; {_read(report)}")
    if state == "CANCELLED":
        return Verdict(Outcome.INTERRUPTED, reason="job step cancelled (scancel or preemption)")
    rb = report.readback or {}
    res = report.result
    value = res.model_tflops_per_device if res is not None else None
    complete_run = rb.get("steps", 0) >= rb.get("expected", 1 << 60)
    if value is not None and value > 0 and (report.returncode == 0 or complete_run):
        return Verdict(Outcome.COMPLETE, value=float(value))
    invalid = f"; {report.result_error}" if report.result_error else ""
    if report.error_line:
        # The program's own words lead; the full logs stay in the trial's folder.
        return Verdict(Outcome.ERROR, reason=f"{report.error_line}\n({_exit(report)}; "
                       f"{_read(report)}{invalid}; the logs are in the trial's folder)"[:4000])
    head = f"{_exit(report)}; {_read(report)}{invalid}"[:2000]
    return Verdict(Outcome.ERROR, reason=head + tail[-(4000 - len(head)):])


def _measured_stop(report: LaunchReport) -> Verdict | None:
    """A program autotune stopped because it had measured enough
    (:mod:`autotune.workloads.adaptive`): its steps are the measurement."""
    stop, res = report.measured_stop, report.result
    value = res.model_tflops_per_device if res is not None else None
    if stop is None or value is None or value <= 0:
        return None
    precision = stop.get("precision")
    reached = f"median to {precision:.1%}" if precision is not None else "no interval yet"
    why = (f"stopped by autotune after {stop.get('steps')} timed steps ({stop.get('reason')}: "
           f"{reached}, target {stop.get('target_precision')}, cap {stop.get('cap')})")
    if stop.get("reason") == "hopeless":
        return Verdict(Outcome.STOPPED, value=float(value), reason=f"{stop.get('detail')}; {why}")
    return Verdict(Outcome.COMPLETE, value=float(value), reason=why)


def _exit(report: LaunchReport) -> str:
    code = report.returncode
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code > 128:  # a shell or launcher reports a child's signal as 128 + N
        try:
            return f"exit code {code} ({signal.Signals(code - 128).name}?)"
        except ValueError:
            pass
    return f"exit code {code}"


def _read(report: LaunchReport) -> str:
    rb = report.readback or {}
    if not rb.get("source"):
        return "no step reported (no metrics file line, no Megatron-DeepSpeed or DeepSpeed " \
               "pipeline log line)"
    return (f"{rb.get('steps', 0)} step(s) read from {rb['source']}, {rb.get('dropped', 0)} "
            f"dropped as warm-up, {rb.get('measured', 0)} measured")


def _from_result(res: TrialResult) -> Verdict:
    if res.status == "ok":
        value = res.model_tflops_per_device
        if value is None or not value > 0:
            return Verdict(Outcome.ERROR, reason=f"status ok but model_tflops_per_device={value!r}")
        # The result file is complete and atomic: a non-zero exit after it (a rank's
        # teardown, say) does not invalidate the measurement; the exit code stays in
        # launch.json (docs/trainer.md, "Failures").
        if res.early_stopped:
            return Verdict(Outcome.STOPPED, value=float(value),
                           reason=res.early_stop_reason or "stopped early: hopeless")
        return Verdict(Outcome.COMPLETE, value=float(value))
    if res.status == "oom":
        return Verdict(Outcome.OOM, reason=(res.error or "out of memory").strip()[-2000:])
    return Verdict(Outcome.ERROR,
                   reason=(res.error or "the trainer reported an error").strip()[-4000:])
