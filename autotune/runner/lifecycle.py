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
from autotune.storage import Lease, Storage, claim_lease

__all__ = ["Busy", "heartbeat", "StopSignals"]


@contextmanager
def heartbeat(storage: Storage, trial_id: int, *,
              renew: Callable[[], object] | None = None,
              lease: Lease | None = None,
              on_lost: Callable[[Lease], None] | None = None) -> Iterator[Lease]:
    """Renew a lease every ``storage.heartbeat_interval_s`` until the block ends (a claim
    made the first lease in its trial's own transaction, so there is no instant at which
    the trial is alive without one: :mod:`autotune.storage.claims`). The block holds the
    launch and the record: a slow record is still beating.

    ``lease``: the lease (default: ``trial_id``'s claim's). Once it is lost
    (:meth:`Lease.beat`: refused, or no renewal for the grace period) the beating stops
    and ``on_lost`` is called once, from the heartbeat's thread: the caller cancels what
    the lease covered, since another runner may hold it now. ``renew``: a bare renewal
    to call instead of the lease's (its result is ignored; kept for callers that hold no
    :class:`Lease`)."""
    stop = threading.Event()
    held = (lease if lease is not None else _BareRenewal(storage, trial_id, renew)
            if renew is not None else claim_lease(storage, trial_id))

    def beat() -> None:
        while not stop.wait(storage.config.heartbeat_interval_s):
            if not held.beat():
                if on_lost is not None and not stop.is_set():
                    on_lost(held)
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{held.what}", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join(timeout=5)


class _BareRenewal(Lease):
    """A lease renewed by a caller's function, whose answer is not a lease's."""

    def __init__(self, storage: Storage, key: int, renew: Callable[[], object]) -> None:
        super().__init__(storage, None, None, key, f"lease {key}")
        self._renew = renew

    def renew(self) -> bool:
        self._renew()
        return True


class StopSignals:
    """SIGINT/SIGTERM: cancel the running trials of every launcher, stop launching.

    Installed by the main thread (Python delivers signals there); worker threads running
    side by side read :attr:`received`. The previous handlers are restored on exit.
    """

    def __init__(self, launchers: Sequence[Launcher],
                 signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.launchers = list(launchers)
        self.signals = tuple(signals)
        """The signals handled (a scaling run between two sizes: SIGTERM only)."""
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
            for sig in self.signals:
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
