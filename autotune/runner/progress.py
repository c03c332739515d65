"""Live progress of a study run: one line per event on stderr, plus a final table.

Lines, not a curses screen: the same output reads well in a terminal, a SLURM log and
CI. Each line says which trial of how many, the layout, its result, the best so far,
elapsed time and an ETA from the mean trial time.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from optuna.trial import FrozenTrial

from autotune.layout import Layout
from autotune.runner.outcome import Outcome
from autotune.runner.records import trial_layout_key

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``75`` → ``1m15s``; ``3725`` → ``1h02m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """Prints trial starts and ends with the best so far and an ETA."""

    def __init__(self, total: int, *, already: int = 0, enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.total = total
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
            text += f", ETA {format_duration(eta)}"
        return text

    def message(self, text: str) -> None:
        self._print(f"[autotune] {text}")

    def trial_started(self, number: int, layout: Layout, predicted: float | None) -> None:
        self._trial_started = time.monotonic()
        pred = f" (predicted {predicted:.4g} TFLOPS/device)" if predicted else ""
        self._print(f"[{self.done + 1}/{self.total}] trial #{number} {layout.key()}: "
                    f"running on {layout.world_size} device(s){pred}; {self._clock()}")

    def trial_finished(self, number: int, layout: Layout, outcome: Outcome,
                       best: FrozenTrial | None) -> None:
        self.done += 1
        self._finished_here += 1
        took = format_duration(time.monotonic() - self._trial_started)
        if outcome.kind == "complete":
            what = f"{outcome.value:.4g} TFLOPS/device"
        else:
            first = outcome.reason.strip().splitlines()[0] if outcome.reason else ""
            what = f"{outcome.kind.upper()} {first[:120]}"
        best_txt = (f"best {best.value:.4g} (#{best.number} {trial_layout_key(best)})"
                    if best is not None and best.value is not None else "no best yet")
        self._print(f"[{self.done}/{self.total}] trial #{number} {layout.key()}: {what} "
                    f"in {took}; {best_txt}; {self._clock()}")
