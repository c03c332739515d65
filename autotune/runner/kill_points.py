"""The fault-injection tests' kill and stop points: a test hook, not a setting. The worker
calls :func:`test_kill_point` at the instants a runner can die between two writes."""

from __future__ import annotations

import os
import signal

__all__ = ["TEST_KILL_ENV", "TEST_STOP_ENV", "test_kill_point"]

TEST_KILL_ENV = "AUTOTUNE_TEST_KILL_AT"
"""A test hook, not a setting: ``after-claim`` (between the claim and the launch),
``after-launch`` (the trial ran, nothing recorded), ``in-claim`` (inside the claim's
transaction, its locks held, before its commit) or ``in-record`` (inside the record's
transaction, before its commit) makes the runner SIGKILL itself there, so that the
fault-injection tests (tests/runner/test_kills.py, tests/faults/) hit those instants
exactly."""

TEST_STOP_ENV = "AUTOTUNE_TEST_STOP_AT"
"""The same instants, with SIGSTOP instead, once per process: a worker frozen there (a
node swapping, a suspended job) until the test sends it SIGCONT (tests/faults/)."""

_stopped_once: set[str] = set()


def test_kill_point(point: str) -> None:
    """SIGKILL (or SIGSTOP once) this process at ``point`` when the test asks for it."""
    if os.environ.get(TEST_KILL_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(TEST_STOP_ENV) == point and point not in _stopped_once:
        _stopped_once.add(point)
        os.kill(os.getpid(), signal.SIGSTOP)
