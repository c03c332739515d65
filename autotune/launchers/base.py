"""The launcher contract: run one trial spec somewhere and hand back what happened.

Backends are peers around this small core (submitit's template method): :meth:`Launcher.run`
owns the flow — lay out the trial directory, write the spec, start, wait with a timeout,
kill on timeout, cancel or lost progress, read the result back — and a backend fills four
hooks:

* ``_start(spec, paths)``: start the trial without blocking; return a handle. Raise
  :class:`~autotune.errors.LaunchError` only if it could not be started at all.
* ``_poll(handle)``: ``None`` while running, else the exit code.
* ``_kill(handle)``: stop the trial and *every* process it started (the whole process
  group, or the job step); must be safe to call twice.
* ``_finish(handle)`` (optional): scheduler facts once it ended — a state such as SLURM's
  ``OUT_OF_MEMORY`` and the hosts it ran on.

*What* runs is the launcher's :attr:`Launcher.workload` (:mod:`autotune.workloads`):
autotune's trainer by default, or the user's own program. The flow calls its hooks too:
``prepare`` (the trial's files), ``argv``/``env`` (inside a backend's ``_start``), ``watch``
(asked on every poll whether the trial still makes progress) and ``finish`` (the result).

Contract, checked for every backend by one test class (``LauncherContract`` in
``tests/launchers/contract.py``, run against each launcher in ``tests/launchers/``):

1. ``run`` never raises for a trial that failed; the failure is in the :class:`LaunchReport`.
2. A trial still running at ``timeout_s`` is killed, with all its processes, and reported
   ``timed_out``.
3. :meth:`Launcher.cancel` (from another thread or a signal handler) makes ``run`` kill
   the trial and return promptly with ``interrupted`` set.
4. The result is whatever the trainer wrote atomically to ``paths.result`` (or ``None``):
   outcomes are decided from that file and the report (:class:`~autotune.trial.report.LaunchReport`)
   by :func:`autotune.trial.classify.classify`, never by reading logs. ``stderr_tail`` is
   only for humans. A foreign workload writes the result file from what its program
   reported (``finish``), classified by the same function.
5. A trial whose workload watch reports no progress is killed like a timed-out one, and
   reported ``no_progress``. One whose watch says it measured enough
   (:mod:`autotune.workloads.adaptive`) is stopped the same way (:meth:`_kill`: SIGTERM,
   then SIGKILL after a grace) and reported with ``measured_stop``.
6. :meth:`Launcher.run_batch` runs several trials of one world size in one launch (a
   *batch*: the start-up -- process start, imports, rendezvous, communicator -- is paid
   once) and returns one report per trial, each as :meth:`Launcher.run` would have: a
   trial whose result file was written keeps it whatever happened after; a trial left
   without one because the launch crashed is run again alone (so a crash is charged to
   the trial that crashes alone, not to one that ran after it); after a cancel it is
   reported ``interrupted``. The timeout applies to each trial of the batch: the launch
   is killed when ``timeout_s`` passes without a new result, the trial that was running
   then is reported ``timed_out`` and the ones after it are run again alone. Backends
   need nothing for it: the workload's ``argv`` names every trial of the launch
   (:attr:`TrialPaths.batch`), the launch's logs and ``launch.json`` are in the first
   trial's directory, and each other trial's ``launch.json`` points there. A backend opts in with
   :attr:`Launcher.supports_batches` (the local and SLURM launchers: they start the
   workload's ``argv``); the others, and every launcher whose workload cannot run several
   trials in one process (a foreign program), run them one by one and the runner proposes
   one layout at a time (:attr:`Launcher.batches`).
7. ``run_batch(..., hold=True)`` (a batching launcher) returns once every member wrote its
   result, with the launch still up and waiting (:mod:`autotune.launchers.held`): the
   confirmation round may run in it (:meth:`Launcher.held_launch`,
   :meth:`Launcher.wait_held`); any other launch, and :meth:`Launcher.release_held`, ends
   it first. A launch that ends by itself meanwhile is simply gone.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from autotune.launchers.held import HOLD_S, HeldLaunch, word_path
from autotune.layout import Layout
from autotune.trial import LaunchReport, TrialPaths, TrialSpec
from autotune.util.atomic import write_json_atomic
from autotune.workloads.base import BuiltinWorkload, ProgressWatch, Workload

__all__ = ["Launcher", "tail"]

_POLL_S = 0.2


def tail(path: Path, lines: int = 20, max_chars: int = 4000) -> str:
    """The last lines of a log file (for humans; outcomes never depend on it)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-max_chars:]


class Launcher(ABC):
    """Abstract base of all launchers; see the module docstring for the contract."""

    kind: ClassVar[str] = "abstract"
    supports_batches: ClassVar[bool] = False
    """Whether ``_start`` starts the workload's ``argv`` (so that a batch's trials all run:
    contract 6); a backend that answers from elsewhere (a table, a script) leaves it off."""
    supports_hold: ClassVar[bool] = False
    """Whether a batch's launch may be held for the confirmation round (contract 7): the
    local launcher. A SLURM step would need its ``--time`` backstop and its energy read
    to cover the round as well: not built, so its last batch ends as any other."""

    def __init__(self) -> None:
        self._cancel = threading.Event()
        self._abandon = threading.Event()
        self.workload: Workload = BuiltinWorkload()
        """What the trials run (:func:`autotune.launchers.make_launcher` sets the study's)."""
        self._held: HeldLaunch | None = None

    def cancel(self) -> None:
        """Ask a running :meth:`run` to kill its trial and return (thread/signal safe)."""
        self._cancel.set()

    def abandon(self) -> None:
        """Kill the launch under way and return, as :meth:`cancel` does, without stopping
        the launcher: its trial's lease was lost, the layout is someone else's now. Until
        :meth:`clear_abandoned`, a trial started is killed at once (thread safe)."""
        self._abandon.set()

    def clear_abandoned(self) -> None:
        """Before a new launch: an earlier :meth:`abandon` no longer applies."""
        self._abandon.clear()

    @property
    def abandoned(self) -> bool:
        return self._abandon.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def fixed_layouts(self) -> tuple[Layout, ...] | None:
        """The only layouts this launcher can measure, or ``None`` for any.

        A replayed table answers for its own rows only: the study then searches exactly
        those (:func:`autotune.runner.study.run_study`) instead of the study file's space.
        """
        return None

    @property
    def batches(self) -> bool:
        """Whether :meth:`run_batch` runs several trials in one launch (else one by one)."""
        return self.supports_batches and self.workload.batchable

    def run(self, spec: TrialSpec, paths: TrialPaths, *, timeout_s: float) -> LaunchReport:
        """Run one trial to its end (template method; see the contract above)."""
        self.release_held()
        paths.prepare()
        write_json_atomic(paths.spec, spec.to_dict())
        self.workload.prepare(spec, paths)
        report = self._launch(spec, paths, timeout_s=timeout_s, members=[])
        self.workload.finish(spec, paths, report)
        write_json_atomic(paths.report, report.to_dict())
        return report

    def run_batch(self, specs: Sequence[TrialSpec], paths: Sequence[TrialPaths], *,
                  timeout_s: float, hold: bool = False) -> list[LaunchReport]:
        """Run trials of one world size in one launch; one report each (contract, 6);
        ``hold``: leave the launch up once they are done (contract, 7)."""
        self.release_held()
        hold = hold and self.batches and self.supports_hold
        if len(specs) != len(paths) or not specs:
            raise ValueError(f"run_batch: {len(specs)} specs for {len(paths)} trial paths")
        if len({s.layout.world_size for s in specs}) > 1:
            raise ValueError("run_batch: the trials of a launch must share the world size, got "
                             + ", ".join(str(s.layout.world_size) for s in specs))
        if (len(specs) == 1 and not hold) or not self.batches:
            alone = []
            for spec, member in zip(specs, paths, strict=True):
                report = self.run(spec, member, timeout_s=timeout_s)
                report.batch = {"index": 0, "size": 1, "lead": str(member.root),
                                "rerun": False}
                alone.append(report)
            return alone
        for spec, member in zip(specs, paths, strict=True):
            member.prepare()
            write_json_atomic(member.spec, spec.to_dict())
            self.workload.prepare(spec, member)
        lead = replace(paths[0], batch=tuple(paths[1:]),
                       hold=(word_path(paths[0]), HOLD_S) if hold else None)
        launched_wall = time.time()
        launch = self._launch(specs[0], lead, timeout_s=timeout_s, members=list(paths),
                              hold=hold)
        ended_wall = time.time()
        write_json_atomic(paths[0].report, {**launch.to_dict(), "status": None,
                                            "batch": {"size": len(specs), "members": [
                                                str(p.root) for p in paths]}})
        reports: list[LaunchReport | None] = []
        boundary, last = launched_wall, None
        for index, (spec, member) in enumerate(zip(specs, paths, strict=True)):
            done = replace(launch, result=None, timed_out=False, interrupted=False,
                             batch={"index": index, "size": len(specs),
                                    "lead": str(paths[0].root), "rerun": False})
            self.workload.finish(spec, member, done)
            if done.result is None and done.result_error is None:
                reports.append(None)  # unfinished: run alone below (or interrupted)
                continue
            if launch.timed_out and _stopped_by_launcher(done):
                # The trial our timeout killed: the trainer's SIGTERM handler still wrote
                # it an ``error`` result (trainer/run.py, ``Terminated``), which would hide
                # the timeout. It is the hung one below.
                reports.append(None)
                continue
            # Each trial is charged the launch's wall time since the previous result (the
            # first, the start-up too), so that a batch's reports add up to its launch.
            end = (done.result.wall_clock.get("result") if done.result else None) \
                or ended_wall
            done.elapsed_s = max(0.0, min(end, ended_wall) - boundary)
            boundary, last = max(boundary, min(end, ended_wall)), done
            reports.append(done)
        if last is not None and all(r is not None for r in reports):
            last.elapsed_s += max(0.0, ended_wall - boundary)  # the launch's exit
        out: list[LaunchReport] = []
        hung = next((i for i, r in enumerate(reports) if r is None), None) \
            if launch.timed_out else None
        for index, (spec, member) in enumerate(zip(specs, paths, strict=True)):
            found = reports[index]
            if found is not None:
                report = found
            elif index == hung:
                # It was running when its timeout (since the previous result) passed: the
                # timeout is its own, and running it again alone would only wait again.
                report = replace(launch, result=None, elapsed_s=max(0.0, ended_wall - boundary),
                                 batch={"index": index, "size": len(specs),
                                        "lead": str(paths[0].root), "rerun": False})
            else:
                if launch.interrupted or self.cancelled or self.abandoned:
                    report = replace(launch, result=None, interrupted=True, batch={
                        "index": index, "size": len(specs), "lead": str(paths[0].root),
                        "rerun": False})
                else:
                    report = self.run(spec, member, timeout_s=timeout_s)
                    report.batch = {"index": index, "size": len(specs),
                                    "lead": str(paths[0].root), "rerun": True}
            write_json_atomic(member.report, report.to_dict())
            out.append(report)
        return out

    def _launch(self, spec: TrialSpec, paths: TrialPaths, *, timeout_s: float,
                members: list[TrialPaths], hold: bool = False) -> LaunchReport:
        """Start, wait, kill: the flow of one launch (one trial, or a batch's ``members``,
        whose timeout runs from the last result written; ``hold``: once every member's
        result is there, the launch is kept, not waited for: contract, 7)."""
        started = time.monotonic()
        handle = self._start(spec, paths)
        return self._await(handle, paths, world_size=spec.layout.world_size,
                           started=started, timeout_s=timeout_s,
                           members=members, watch=self.workload.watch(spec, paths),
                           hold=hold)

    def _await(self, handle: Any, paths: TrialPaths, *, world_size: int, started: float,
               timeout_s: float, members: list[TrialPaths], watch: ProgressWatch | None,
               hold: bool = False) -> LaunchReport:
        """Wait for a started launch (``handle``) to end, killing it on a timeout, a
        cancel, lost progress or its watch's word; its report."""
        timed_out = interrupted = no_progress = held = False
        measured_stop: dict[str, Any] | None = None
        returncode: int | None = None
        deadline_from, finished = started, 0
        try:
            while True:
                returncode = self._poll(handle)
                if returncode is not None:
                    break
                if self._cancel.is_set() or self._abandon.is_set():
                    interrupted = True
                    break
                if members:
                    done = sum(m.result.exists() for m in members)
                    if done > finished:
                        deadline_from, finished = time.monotonic(), done
                    if hold and done == len(members):
                        held = True  # every result is in: the launch waits for a word
                        break
                if time.monotonic() - deadline_from > timeout_s:
                    timed_out = True
                    break
                if watch is not None and watch.stalled():
                    no_progress = True
                    break
                if watch is not None and (measured_stop := watch.enough()) is not None:
                    break  # measured enough: stopped like a timeout, recorded as measured
                time.sleep(_POLL_S)
        finally:
            if returncode is None and not held:  # timeout, cancel, measured, an exception
                self._kill(handle)
                returncode = self._poll(handle)
        if held:
            self._held = HeldLaunch(handle, paths, world_size, started, time.monotonic())
            # Every trial wrote its result and the launch is up: for the trials, it ended
            # well (the trainer's exit code would say the same of them).
            returncode = 0
        state, hosts = self._finish(handle)
        return LaunchReport(result=None, returncode=returncode, timed_out=timed_out,
                            interrupted=interrupted, scheduler_state=state,
                            stderr_tail=self._stderr_tail(paths), hosts=hosts,
                            elapsed_s=time.monotonic() - started,
                            workload=self.workload.kind, no_progress=no_progress,
                            no_progress_reason=watch.describe() if no_progress and watch
                            else "", measured_stop=measured_stop)

    def held_launch(self, world_size: int) -> HeldLaunch | None:
        """The held launch, if it is still up and may take a rotation of ``world_size``
        ranks (one that ended by itself, or is about to, is released here)."""
        held = self._held
        if held is None:
            return None
        if self._poll(held.handle) is not None or not held.usable(world_size):
            self.release_held()
            return None
        return held

    def wait_held(self, held: HeldLaunch, word: dict[str, Any], *, timeout_s: float,
                  watch: ProgressWatch | None) -> LaunchReport:
        """Hand ``word`` to the held launch and wait for its end, as :meth:`_launch` waits
        (``watch`` polled); its report's elapsed time runs from the batch's end."""
        if self._held is not held:
            raise ValueError("wait_held: that launch is not the one held")
        self._held = None
        write_json_atomic(held.word, word)
        return self._await(held.handle, held.paths, world_size=held.world_size,
                           started=held.since, timeout_s=timeout_s, members=[], watch=watch)

    def release_held(self, grace_s: float = 10.0) -> None:
        """End the held launch, if any: the word to exit, then a kill after ``grace_s``
        (or at once after a cancel)."""
        held, self._held = self._held, None
        if held is None:
            return
        if self._poll(held.handle) is None and not self.cancelled:
            write_json_atomic(held.word, {"exit": True})
            ends = time.monotonic() + grace_s
            while self._poll(held.handle) is None and time.monotonic() < ends:
                time.sleep(_POLL_S)
        if self._poll(held.handle) is None:
            self._kill(held.handle)
        self._finish(held.handle)

    def _stderr_tail(self, paths: TrialPaths) -> str:
        parts = [tail(p, 10) for p in paths.rank_errors()]
        parts.append(tail(paths.stderr))
        return "\n".join(p for p in parts if p)[-4000:]

    @abstractmethod
    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any: ...

    @abstractmethod
    def _poll(self, handle: Any) -> int | None: ...

    @abstractmethod
    def _kill(self, handle: Any) -> None: ...

    def _finish(self, handle: Any) -> tuple[str | None, list[str]]:
        return None, []

    def describe(self) -> dict[str, Any]:
        """Facts about the launcher for the measurements table."""
        return {"launcher": self.kind, **self.workload.describe()}


_LAUNCHER_STOPPED = "(the launcher stopped this rank)"
"""The trainer's words for a rank ended by the launcher's SIGTERM (trainer/run.py)."""


def _stopped_by_launcher(report: LaunchReport) -> bool:
    res = report.result
    return res is not None and res.status == "error" and _LAUNCHER_STOPPED in (res.error or "")
