"""The workload contract: what a trial runs, and how what it did is read back.

A launcher (:mod:`autotune.launchers.base`) owns *where* and *how long* a trial runs; a
:class:`Workload` owns *what* runs and what its output means. The launcher's template
method calls these hooks, in order:

* :meth:`Workload.prepare` once the trial directory exists (write the trial's files);
* :meth:`Workload.argv` and :meth:`Workload.env` when it builds the command: the program one
  rank runs (:attr:`Workload.per_device`) or the whole launch line (``outer: none``), given
  the :class:`Placement` the launcher chose;
* :meth:`Workload.watch` right after the start: a :class:`ProgressWatch` the launcher asks
  on every poll whether the trial still makes progress, and whether it measured enough to
  be stopped (:meth:`ProgressWatch.enough`; ``None``: no such watch);
* :meth:`Workload.finish` once the trial ended: fill the report's result.

:class:`BuiltinWorkload` is autotune's own trainer, which writes its result file itself.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from autotune.errors import SpecError
from autotune.trial import LaunchReport, TrialPaths, TrialSpec, read_result
from autotune.workloads.build_locks import stale_lock_hint

if TYPE_CHECKING:
    from autotune.trial.outcome import OomSignature

__all__ = ["Placement", "Workload", "BuiltinWorkload", "ProgressWatch"]


@dataclass(frozen=True)
class Placement:
    """Where a trial's ranks run, as the launcher decided: what a command template and a
    rank's environment may need to know."""

    python: str
    """The interpreter trials run with (``launcher.local.python`` or the runner's)."""
    nodes: int
    ranks_per_node: int
    master_addr: str
    master_port: int
    rank_env: tuple[str, ...] = ()
    """A prefix that gives a foreign program torchrun's variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) where the launcher does not set them
    itself (srun): :mod:`autotune.workloads.rank_env`."""


class StepSource(Protocol):
    """What a watch asks (:class:`autotune.workloads.readback.StepCounter`)."""

    @property
    def steps(self) -> int: ...

    def update(self) -> bool: ...


class ProgressWatch:
    """Says when a running trial stopped making progress: no first step within
    ``first_step_s`` of the start, or no new step for ``no_progress_s`` after one; once
    ``expected_steps`` were seen it never says so (the program is finishing)."""

    def __init__(self, counter: StepSource, *, first_step_s: float, no_progress_s: float,
                 expected_steps: int, clock: Callable[[], float] = time.monotonic,
                 lock_env: Mapping[str, str] | None = None) -> None:
        self.counter, self.clock = counter, clock
        # The trial's environment, to look for torch build locks older than the trial when
        # it makes no first step (autotune.workloads.build_locks); None: not looked for.
        self.lock_env, self.started_wall = lock_env, time.time()
        self.first_step_s, self.no_progress_s = first_step_s, no_progress_s
        self.expected_steps = expected_steps
        self.started = self.last_step = clock()
        self.stalled_for_s: float | None = None

    def stalled(self) -> bool:
        now = self.clock()
        if self.counter.update():
            self.last_step = now
        steps = self.counter.steps
        if steps >= self.expected_steps:
            return False
        limit = self.first_step_s if steps == 0 else self.no_progress_s
        if now - self.last_step > limit:
            self.stalled_for_s = now - self.last_step
            return True
        return False

    def enough(self) -> dict[str, Any] | None:
        """Whether the trial has measured enough to be stopped now, asked right after
        :meth:`stalled`: ``None`` (this watch never says so: the program runs its steps),
        or what the stop is recorded with
        (:class:`autotune.workloads.adaptive.MeasuringWatch`)."""
        return None

    def describe(self) -> str:
        steps = self.counter.steps
        what = "no first step" if steps == 0 else f"no new step after step {steps}"
        limit = "workload.startup_s" if steps == 0 else "workload.no_progress_s"
        hint = stale_lock_hint(self.lock_env, before=self.started_wall) \
            if steps == 0 and self.lock_env is not None else ""
        return f"{what} for {self.stalled_for_s or 0:.0f} s ({limit}){hint}"


class Workload(ABC):
    """Abstract base of the workloads; the hooks are called by the launcher (see above)."""

    kind: ClassVar[str] = "abstract"
    per_device: bool = True
    """Whether the launcher starts :meth:`argv` once per device (else once, or once per
    node on SLURM: the command launches its own ranks)."""
    batchable: bool = False
    """Whether one launch can run several trials (:attr:`TrialPaths.batch` in
    :meth:`argv`): autotune's trainer can, a user's program cannot."""
    oom_signatures: ClassVar[tuple[OomSignature, ...]] = ()
    """The out-of-memory texts its output may hold, for the classifier
    (:func:`autotune.trial.classify.classify`); none for autotune's trainer, whose result
    file says ``oom`` itself."""

    def prepare(self, spec: TrialSpec, paths: TrialPaths) -> None:  # noqa: B027 (a hook)
        """Write what the trial reads before it starts (nothing by default)."""

    @abstractmethod
    def argv(self, spec: TrialSpec, paths: TrialPaths, placement: Placement) -> list[str]:
        """The command the launcher starts."""

    def env(self, spec: TrialSpec, paths: TrialPaths) -> dict[str, str]:
        """Environment variables the program gets on top of the launcher's."""
        return {}

    def watch(self, spec: TrialSpec, paths: TrialPaths) -> ProgressWatch | None:
        return None

    @abstractmethod
    def finish(self, spec: TrialSpec, paths: TrialPaths, report: LaunchReport) -> None:
        """Fill ``report.result`` (and what else the outcome is decided from)."""

    def describe(self) -> dict[str, str]:
        return {"workload": self.kind}


class BuiltinWorkload(Workload):
    """autotune's trainer: ``python -m trainer --spec S --result R`` on every rank; rank 0
    writes the result file atomically, which is all that is read back."""

    kind = "builtin"
    batchable = True

    def argv(self, spec: TrialSpec, paths: TrialPaths, placement: Placement) -> list[str]:
        """Every trial of the launch as a ``--spec/--result`` pair, in order."""
        pairs: list[str] = []
        for member in (paths, *paths.batch):
            pairs += ["--spec", str(member.spec), "--result", str(member.result)]
        if paths.hold is not None:  # the study's last batch, held for the round
            pairs += ["--hold", str(paths.hold[0]), "--hold-s", f"{paths.hold[1]:g}"]
        return [placement.python, "-m", "trainer", *pairs]

    def finish(self, spec: TrialSpec, paths: TrialPaths, report: LaunchReport) -> None:
        try:
            report.result = read_result(paths.result)
        except SpecError as err:
            report.result_error = str(err)


def log_paths(paths: TrialPaths) -> list[Path]:
    """The logs a foreign trial's steps may be printed to."""
    return [paths.stdout, paths.stderr]
