"""A batch's launch held open after its last result, for the confirmation round.

The study's last batch of the built-in trainer is launched with ``--hold`` (:mod:`trainer.
hold`): once every member has written its result, :meth:`autotune.launchers.base.Launcher.
run_batch` returns the batch's reports as usual but leaves the processes up, waiting for a
word in :attr:`HeldLaunch.word`. The confirmation round then runs its rotation in them
(:mod:`autotune.runner.confirm_rotation`) without a second start-up; whatever else comes
next (a skipped round, a new launch, the run's end) releases them first
(:meth:`~autotune.launchers.base.Launcher.release_held`), and the trainer ends by itself
after :data:`HOLD_S` without a word. Which batch is held is the runner's call
(:class:`autotune.runner.worker.Worker`): the last one of a study whose round could run in
it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.trial import TrialPaths

__all__ = ["HeldLaunch", "HOLD_S", "HOLD_MARGIN_S", "WORD_FILE"]

HOLD_S = 120.0
"""How long the trainer waits for the runner's word (``--hold-s``): the runner records the
batch, ends its search and plans the round in seconds; a runner killed meanwhile leaves
the processes for no longer than this."""
HOLD_MARGIN_S = 15.0
"""A held launch this close to the trainer's own end is not used: the word could arrive
after the trainer gave up waiting."""
WORD_FILE = "hold.json"


@dataclass
class HeldLaunch:
    """A launch whose batch is done and whose processes wait for a word."""

    handle: Any
    """The backend's handle (``_poll``/``_kill`` take it)."""
    paths: TrialPaths
    """The lead trial's paths: the launch's logs are there."""
    world_size: int
    started: float
    """When the launch started (:func:`time.monotonic`)."""
    since: float
    """When its batch's last result was read: from then on its time is the round's."""

    @property
    def word(self) -> Path:
        return word_path(self.paths)

    def usable(self, world_size: int, now: float | None = None) -> bool:
        """Whether a rotation of ``world_size`` ranks may still be handed to it."""
        now = time.monotonic() if now is None else now
        return world_size == self.world_size and now - self.since < HOLD_S - HOLD_MARGIN_S


def word_path(paths: TrialPaths) -> Path:
    """Where the runner's word to a held launch goes (beside the lead trial's logs)."""
    return paths.root / WORD_FILE
