"""Outcomes of a foreign process (a workload of the user's own): decided here, in one place.

:func:`autotune.runner.outcome.classify` hands every report of a ``command`` or
``megatron-deepspeed`` trial to :func:`foreign_outcome`. Such a program writes no result file
of autotune's; what it did is read from what the launcher saw and what the workload read
back (:mod:`autotune.workloads.readback`):

==================================================  ===========  ==========================
seen                                                outcome      note
==================================================  ===========  ==========================
cancelled by the runner / scheduler ``CANCELLED``   interrupted  retried later
an out-of-memory signature (:data:`OOM_SIGNATURES`)  oom          also when it then hung or
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
                                                                 line (argparse error or
                                                                 exception), else exit code
                                                                 or signal, what was read,
                                                                 the stderr tail
==================================================  ===========  ==========================

The out-of-memory signatures are searched in the program's output (stdout and stderr,
every rank as the launcher collected it), the only evidence a foreign program leaves.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.runner.outcome import Outcome

if TYPE_CHECKING:
    from autotune.launchers.base import LaunchReport

__all__ = ["OomSignature", "OOM_SIGNATURES", "find_oom_signature", "foreign_outcome"]


@dataclass(frozen=True)
class OomSignature:
    text: str
    """What the output contains (matched case-sensitively, as printed)."""
    device: str
    source: str
    """Where the text comes from (file and commit, or the specification)."""


OOM_SIGNATURES: tuple[OomSignature, ...] = (
    OomSignature("torch.OutOfMemoryError", "cuda/xpu",
                 "PyTorch's allocator error class (torch.OutOfMemoryError, raised by "
                 "TORCH_CHECK_WITH(OutOfMemoryError, ...) in the caching allocators)"),
    OomSignature("OutOfMemoryError", "cuda/xpu",
                 "the same class as a traceback prints it (torch.cuda.OutOfMemoryError)"),
    OomSignature("CUDA out of memory", "cuda",
                 "pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (commit eb42ad6e): "
                 "\"CUDA out of memory. Tried to allocate ...\""),
    OomSignature("CUBLAS_STATUS_ALLOC_FAILED", "cuda",
                 "cuBLAS cublasStatus_t: resource allocation failed inside cuBLAS "
                 "(cublasCreate when the device is full)"),
    OomSignature("XPU out of memory", "xpu",
                 "pytorch/pytorch c10/xpu/XPUCachingAllocator.cpp (commit 1e545826): "
                 "\"XPU out of memory. Tried to allocate ...\""),
    OomSignature("UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "xpu",
                 "oneAPI Unified Runtime ur_result_t (oneapi-src/unified-runtime "
                 "include/ur_api.h, commit aa04ce16): insufficient device memory"),
    OomSignature("UR_RESULT_ERROR_OUT_OF_RESOURCES", "xpu",
                 "oneAPI Unified Runtime ur_result_t (include/ur_api.h): out of resources"),
    OomSignature("PI_ERROR_OUT_OF_RESOURCES", "xpu",
                 "DPC++ plugin interface (PI) error of SYCL runtimes before Unified Runtime"),
    OomSignature("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "xpu",
                 "Level Zero ze_result_t, as oneCCL reports a failed device allocation"),
    OomSignature("Cannot allocate memory", "host",
                 "strerror(ENOMEM), errno(3); PyTorch's CPU allocator prints it as "
                 "\"DefaultCPUAllocator: can't allocate memory ... Error code 12 (Cannot "
                 "allocate memory)\""),
    OomSignature("ENOMEM", "host", "errno(3) name of the host allocation failure"),
    OomSignature("MemoryError", "host", "Python's exception for a failed host allocation"),
    OomSignature("std::bad_alloc", "host", "C++ operator new failure (ISO C++ [new.delete])"),
)
"""Documented out-of-memory texts, with their source."""
_OOM_RE = re.compile("|".join(re.escape(s.text) for s in OOM_SIGNATURES))


def find_oom_signature(text: str) -> OomSignature | None:
    """The first signature of :data:`OOM_SIGNATURES` (in table order) that ``text`` holds."""
    if not _OOM_RE.search(text):
        return None
    return next(s for s in OOM_SIGNATURES if s.text in text)


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


def _measured_stop(report: LaunchReport) -> Outcome | None:
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
        return Outcome("stopped", value=float(value), reason=f"{stop.get('detail')}; {why}")
    return Outcome("complete", value=float(value), reason=why)


def foreign_outcome(report: LaunchReport) -> Outcome:
    """The outcome of a foreign trial (module docstring): the one place it is decided."""
    state = (report.scheduler_state or "").upper().split(" ")[0] or None
    tail = f"\n{report.stderr_tail}" if report.stderr_tail else ""
    if report.interrupted:
        return Outcome("interrupted", reason="cancelled by the runner (interrupt or SIGTERM)")
    oom = find_oom_signature(report.log_text)
    if oom is not None:
        return Outcome("oom", reason=f"out of memory: {oom.text!r} in the output ({oom.device}; "
                       f"{oom.source}){tail}"[-2000:])
    if state == "OUT_OF_MEMORY":
        return Outcome("oom", reason=f"job step state {state}{tail}"[-2000:])
    measured = _measured_stop(report)
    if measured is not None:
        return measured
    if report.timed_out or state in ("TIMEOUT", "DEADLINE"):
        why = f"job step state {state}" if state in ("TIMEOUT", "DEADLINE") else \
            f"killed after {report.elapsed_s:.0f} s (trial timeout)"
        return Outcome("timeout", reason=f"{why}; {_read(report)}")
    if report.no_progress:
        return Outcome("timeout", reason=f"{report.no_progress_reason}: killed with all its "
                       f"processes; {_read(report)}")
    if state == "CANCELLED":
        return Outcome("interrupted", reason="job step cancelled (scancel or preemption)")
    rb = report.readback or {}
    res = report.result
    value = res.model_tflops_per_device if res is not None else None
    complete_run = rb.get("steps", 0) >= rb.get("expected", 1 << 60)
    if value is not None and value > 0 and (report.returncode == 0 or complete_run):
        return Outcome("complete", value=float(value))
    invalid = f"; {report.result_error}" if report.result_error else ""
    if report.error_line:
        # The program's own words lead; the full logs stay in the trial's folder.
        return Outcome("error", reason=f"{report.error_line}\n({_exit(report)}; "
                       f"{_read(report)}{invalid}; the logs are in the trial's folder)"[:4000])
    head = f"{_exit(report)}; {_read(report)}{invalid}"[:2000]
    return Outcome("error", reason=head + tail[-(4000 - len(head)):])
