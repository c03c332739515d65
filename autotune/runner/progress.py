"""Live progress of a study run: one line per event on stderr, plus a final table.

Lines, not a curses screen: the same output reads well in a terminal, a SLURM log and
CI. Each line says which trial of how many, the layout, its result, the best so far,
elapsed time and an ETA from the mean trial time. When the run ends, :func:`trials_table`
lists what was measured, :func:`stop_message` says why it ended and :func:`best_line`
names the best layout.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO

from optuna.trial import FrozenTrial, TrialState

from autotune.layout import Layout
from autotune.storage import (
    SKIPPED,
    AnyTrial,
    Storage,
    TrialAttr,
    TrialStore,
    trial_layout_key,
    trial_outcome,
    trial_reason,
)
from autotune.trial.outcome import Outcome, StopReason, Verdict
from autotune.util.text import format_duration, format_table

__all__ = ["Progress", "format_duration", "trials_table", "stop_message", "best_line"]

_STOP_MESSAGES = {
    StopReason.BUDGET: "budget of {n_trials} trials reached",
    StopReason.EXHAUSTED: "every promising layout was measured",
    StopReason.STRATEGY: "search stopped: {reason}",
    StopReason.TIMEOUT: "wall-time budget reached (run again to continue)",
    StopReason.INTERRUPT: "interrupted: the running trial was killed and will be retried",
    StopReason.SIGTERM: "stopped by SIGTERM: the running trial will be retried",
    StopReason.NODE_FAILURE: "a node of the allocation died: its trial will be retried on "
                             "healthy nodes (run again in a new allocation)",
    StopReason.BROKEN_PROGRAM: "study stopped: trials failed alike (the error and the trial "
                               "folders follow on stderr)",
    StopReason.CONFIRM_INTERRUPT: "interrupted in the confirmation round: the best below is "
                                  "the single pass's, unconfirmed; the next run goes on from "
                                  "the stored rounds",
    StopReason.CONFIRM_TIMEOUT: "wall-time budget reached in the confirmation round: the best "
                                "below is the single pass's, unconfirmed (run again to "
                                "continue)",
}


class Progress:
    """Prints trial starts and ends with the best so far and an ETA."""

    def __init__(self, total: int, *, already: int = 0, enabled: bool = True,
                 stream: TextIO | None = None, confirm_share: float = 0.0) -> None:
        self.total = total
        self.confirm_share = confirm_share
        """The confirmation round's most, as a fraction of the search's time (its device
        budget: one world size, so device-seconds and wall time scale alike); the ETA
        includes it."""
        self.done = already
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self._trial_started = self.started
        self._finished_here = 0

    def _print(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def _clock(self) -> str:
        elapsed = time.monotonic() - self.started
        text = f"elapsed {format_duration(elapsed)}"
        if self._finished_here:
            left = max(self.total - self.done, 0)
            eta = elapsed / self._finished_here * left
            eta += self.confirm_share * (elapsed + eta)
            text += f", ETA {format_duration(eta)}"
        return text

    def message(self, text: str) -> None:
        self._print(f"[autotune] {text}")

    def resume(self, judged: int) -> None:
        """The study already holds ``judged`` trials of its budget (a resume): the counter
        goes on from there and the ETA covers only the trials that remain."""
        self.done = judged
        if judged:
            left = max(self.total - judged, 0)
            self.message(f"resuming: {judged} of {self.total} trials measured, {left} to go")

    def trial_started(self, number: int, layout: Layout, predicted: float | None) -> None:
        self._trial_started = time.monotonic()
        pred = f" (predicted {predicted:.4g} TFLOPS/device)" if predicted else ""
        self._print(f"[{self.done + 1}/{self.total}] trial #{number} {layout.key()}: "
                    f"running on {layout.world_size} device(s){pred}; {self._clock()}")

    def launch_started(self, members: Sequence[tuple[int, Layout, float | None]]) -> None:
        """One line for a launch: :meth:`trial_started` for one trial, a batch line for
        several (``members``: number, layout, predicted TFLOPS)."""
        if len(members) == 1:
            self.trial_started(*members[0])
            return
        self._trial_started = time.monotonic()
        first, last = self.done + 1, self.done + len(members)
        names = ", ".join(f"#{n} {lay.key()}" for n, lay, _ in members)
        self._print(f"[{first}-{last}/{self.total}] batch of {len(members)}: running {names}"
                    f" in one launch on {members[0][1].world_size} device(s); {self._clock()}")

    def trial_finished(self, number: int, layout: Layout, outcome: Verdict,
                       best: FrozenTrial | None) -> None:
        self.done += 1
        self._finished_here += 1
        took = format_duration(time.monotonic() - self._trial_started)
        if outcome.kind is Outcome.COMPLETE:
            what = f"{outcome.value:.4g} TFLOPS/device"
        elif outcome.kind is Outcome.STOPPED:
            what = f"STOPPED early at {outcome.value:.4g} TFLOPS/device (hopeless)"
        else:
            first = outcome.reason.strip().splitlines()[0] if outcome.reason else ""
            what = f"{outcome.kind.upper()} {first[:120]}"
        best_txt = (f"best {best.value:.4g} (#{best.number} {trial_layout_key(best)})"
                    if best is not None and best.value is not None else "no best yet")
        self._print(f"[{self.done}/{self.total}] trial #{number} {layout.key()}: {what} "
                    f"in {took}; {best_txt}; {self._clock()}")


def stop_message(stopped_by: str, *, n_trials: int, reason: str | None = None) -> str:
    """Why a run ended, for people (``stopped_by``: the run summary's; ``reason``: the
    strategy's stop reason, with ``strategy``)."""
    return _STOP_MESSAGES[StopReason(stopped_by)].format(n_trials=n_trials, reason=reason)


def best_line(best: FrozenTrial) -> str:
    """The best trial in one line: layout, value, trial number."""
    from autotune.storage import trial_energy_line

    return (f"best layout: {trial_layout_key(best)}  "
            f"{best.value:.4g} model TFLOPS/device (trial #{best.number}); "
            + trial_energy_line(best))


def trials_table(trials: Sequence[AnyTrial]) -> str | None:
    """The judged trials, best first (then failures by number); ``None`` if there is none.

    Skipped proposals and trials not judged yet (waiting, or their runner died) are left
    out: they say nothing about their layout.
    """
    measured = [t for t in trials if trial_outcome(t) not in (None, SKIPPED)
                and t.state != TrialState.WAITING]
    from autotune.storage import measured_value

    values = {id(t): measured_value(t) for t in measured}  # stopped ones too
    measured.sort(key=lambda t: (values[id(t)] is None, -(values[id(t)] or 0.0), t.number))
    rows = [[t.number, trial_layout_key(t), trial_outcome(t), values[id(t)],
             t.user_attrs.get(TrialAttr.STEP_TIME_S), t.user_attrs.get(TrialAttr.PEAK_MEMORY_GIB),
             _first_line(trial_reason(t), 60) if trial_outcome(t) != Outcome.COMPLETE else ""]
            for t in measured]
    if not rows:
        return None
    return format_table(["trial", "layout", "outcome", "TFLOPS/dev", "step_s", "mem_GiB",
                         "reason"], rows)


def _first_line(text: str, width: int) -> str:
    return (text.splitlines() or [""])[0][:width]


def judged_claims(storage: Storage, study_name: str) -> int:
    """The study's budget already spent and judged: layouts claimed, less those waiting
    for a retry or being measured (they are still to be counted when they finish)."""
    counts = TrialStore(storage, study_name).counts()
    return max(counts.claimed - counts.retries - counts.live, 0)
