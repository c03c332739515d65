"""Where a trial's wall time goes: the start-up and the phases of each trial of a launch.

``python -m trainer`` imports this module first, so :data:`PROCESS_START` is (nearly) the
trainer's first line; the phase before it, ``process_start``, runs from the launcher's
launch (``AUTOTUNE_LAUNCH_TIME``, a Unix time the launchers export: torchrun's or srun's
own start, the interpreter's start) to here. Phases after it are measured on the
monotonic clock of this process; wall-clock stamps go with them so that the runner can
place a trial in its launch. Phase names: :data:`autotune.trial.PHASES`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

__all__ = ["PROCESS_START", "Timeline", "LAUNCH_TIME_ENV"]

PROCESS_START = (time.time(), time.monotonic())
"""(Unix time, monotonic time) when the trainer's process got here."""
LAUNCH_TIME_ENV = "AUTOTUNE_LAUNCH_TIME"


class Timeline:
    """Consecutive phases of one trial: :meth:`lap` ends the phase running since the last
    lap (or the start) and books its seconds under the given name."""

    def __init__(self, start_mono: float, start_wall: float) -> None:
        self._last = start_mono
        self.started_wall = start_wall
        self.phases: dict[str, float] = {}

    @classmethod
    def for_launch(cls, env: Mapping[str, str]) -> Timeline:
        """The first trial's: ``process_start`` from the launcher's stamp (0 without one)."""
        wall, mono = PROCESS_START
        timeline = cls(mono, wall)
        try:
            launched = float(env.get(LAUNCH_TIME_ENV, ""))
        except ValueError:
            launched = wall
        timeline.phases["process_start"] = max(0.0, wall - launched)
        timeline.started_wall = min(launched, wall)
        return timeline

    @classmethod
    def now(cls) -> Timeline:
        """A later trial's, starting now (its launch phases are the first trial's)."""
        return cls(time.monotonic(), time.time())

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._last)
        self._last = now

    def breakdown(self, phases: tuple[str, ...]) -> dict[str, float]:
        """Seconds per phase, every name of ``phases`` present (0 when not run here)."""
        return {p: round(self.phases.get(p, 0.0), 4) for p in phases}
