"""A worker's life around one trial: heartbeats while it runs, signals that stop it, and
which side-by-side workers are busy.

Kept apart from the runner's logic (:mod:`autotune.runner.study`) because both deal with threads
and process-wide signal handlers, which deserve one small, careful place.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from autotune.launchers.base import Launcher
from autotune.storage.claims import renew_lease
from autotune.storage.db import Storage

__all__ = ["Busy", "heartbeat", "StopSignals"]


@contextmanager
def heartbeat(storage: Storage, trial_id: int, *,
              renew: Callable[[], object] | None = None) -> Iterator[None]:
    """Renew ``trial_id``'s claim lease every ``storage.heartbeat_interval_s`` until the
    block ends (the claim made the first lease in the trial's own transaction, so there is
    no instant at which the trial is alive without one: :mod:`autotune.storage.claims`).
    The block holds the launch and the record: a slow record is still beating.
    ``renew``: another lease to renew instead (the confirmation round's:
    :mod:`autotune.storage.confirmations`)."""
    stop = threading.Event()
    renew_once = renew or (lambda: renew_lease(storage, trial_id))

    def beat() -> None:
        while not stop.wait(storage.config.heartbeat_interval_s):
            try:
                renew_once()
            except Exception:  # a missed beat is retried; never kill the trial for it
                pass

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


class StopSignals:
    """SIGINT/SIGTERM: cancel the running trials of every launcher, stop launching.

    Installed by the main thread (Python delivers signals there); worker threads running
    side by side read :attr:`received`. The previous handlers are restored on exit.
    """

    def __init__(self, launchers: Sequence[Launcher]) -> None:
        self.launchers = list(launchers)
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stop(signum)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop as if ``signum`` had arrived (a worker thread failed, say)."""
        self.received = signum
        for launcher in self.launchers:
            launcher.cancel()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Busy:
    """How many of one process's side-by-side workers are measuring a trial right now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mine: dict[int, int] = {}

    @contextmanager
    def measuring(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._lock:
            self._mine[me] = self._mine.get(me, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._mine[me] -= 1

    def others(self) -> int:
        """Trials being measured by the other workers (threads) of this process."""
        me = threading.get_ident()
        with self._lock:
            return sum(n for t, n in self._mine.items() if t != me)
