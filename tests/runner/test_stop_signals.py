"""StopSignals is the one handler of stop signals: a study's (SIGINT and SIGTERM, cancelling
its launchers) and a scaling run's between two sizes (SIGTERM only: SIGINT keeps Python's
KeyboardInterrupt there)."""

from __future__ import annotations

import os
import signal

from autotune.runner.lifecycle import StopSignals


def test_between_sizes_only_sigterm_is_caught_and_the_handlers_come_back() -> None:
    before_int, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopSignals([], signals=(signal.SIGTERM,)) as between:
        assert signal.getsignal(signal.SIGINT) is before_int
        os.kill(os.getpid(), signal.SIGTERM)
        assert between.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before_term


def test_a_study_catches_both() -> None:
    with StopSignals([]) as signals:
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.received == signal.SIGINT
