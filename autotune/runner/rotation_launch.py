"""The rotation's launch: the built-in trainer started with ``--rotation``, or the search's
held launch handed the schedule (:mod:`autotune.launchers.held`), read round by round.

:func:`run_rotation` writes the schedule (:mod:`trainer.rotation`), starts or resumes the
launch, hands each round the trainer writes to ``on_round`` while the launch goes on, and
writes the stop file once ``on_round`` says the verdict is settled. Planned and recorded by
:mod:`autotune.runner.confirm_rotation`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.launchers.base import Launcher
from autotune.trial import LaunchReport, TrialPaths, TrialSpec
from autotune.util.atomic import write_json_atomic
from autotune.workloads.base import BuiltinWorkload, Placement, ProgressWatch

__all__ = ["RotationOutcome", "run_rotation", "RoundWatch"]


class _RotationWorkload(BuiltinWorkload):
    """The built-in trainer started with ``--rotation`` (the schedule in the paths' spec
    directory); its watch hands each new round to the runner."""

    def __init__(self, schedule: Path, watch: ProgressWatch) -> None:
        self.schedule = schedule
        self._watch = watch

    def argv(self, spec: TrialSpec, paths: TrialPaths, placement: Placement) -> list[str]:
        return [placement.python, "-m", "trainer", "--rotation", str(self.schedule)]

    def watch(self, spec: TrialSpec, paths: TrialPaths) -> ProgressWatch | None:
        return self._watch


class RoundWatch(ProgressWatch):
    """Polled by the launcher: reads the rotation's result file, hands new rounds on, and
    writes the stop file once ``on_round`` says the verdict is settled."""

    def __init__(self, result: Path, stop: Path,
                 on_round: Callable[[dict[str, Any], float], bool]) -> None:
        self.result, self.stop = result, stop
        self.on_round = on_round
        self.seen = 0
        self.started = time.monotonic()
        self.last = self.started

    def poll(self) -> None:
        try:
            data = json.loads(self.result.read_text())
        except (OSError, ValueError):
            return
        rounds = data.get("rounds") or []
        while self.seen < len(rounds):
            now = time.monotonic()
            done = self.on_round(rounds[self.seen], now - self.last)
            self.last, self.seen = now, self.seen + 1
            if done and not self.stop.exists():
                write_json_atomic(self.stop, {"stop": "settled"})

    def stalled(self) -> bool:
        self.poll()
        return False

    def enough(self) -> dict[str, Any] | None:
        return None

    def describe(self) -> str:
        return f"rotation: {self.seen} round(s) read"


@dataclass
class RotationOutcome:
    report: LaunchReport
    data: dict[str, Any] | None
    """The rotation's final result file (``None``: none written)."""
    tail_s: float
    """Wall seconds of the launch after its last round was handed on (its teardown)."""
    new_launch: bool = True
    """``False``: it ran in the search's held launch (no launch of its own started)."""

    @property
    def coexist(self) -> bool:
        return not (self.data and self.data.get("coexist") is False)


def run_rotation(launcher: Launcher, specs: list[TrialSpec], keys: list[str],
                 orders: list[list[int]], *, steps_per_slot: int, root: Path, timeout_s: float,
                 on_round: Callable[[dict[str, Any], float], bool]) -> RotationOutcome:
    """One launch measuring ``orders`` rounds of ``specs``; ``on_round(round, wall_s)``
    gets each round as it is written (``wall_s``: since the previous one, or the launch's
    start) and returns whether to stop."""
    paths = TrialPaths(root=root)
    paths.prepare()
    spec_paths = []
    for key, spec in zip(keys, specs, strict=True):
        path = root / f"spec-{key}.json"
        write_json_atomic(path, spec.to_dict())
        spec_paths.append(str(path))
    write_json_atomic(paths.spec, specs[0].to_dict())
    schedule = root / "rotation.json"
    stop = root / "stop"
    stop.unlink(missing_ok=True)
    paths.result.unlink(missing_ok=True)
    write_json_atomic(schedule, {"specs": spec_paths, "keys": keys, "rounds": orders,
                                 "steps_per_slot": steps_per_slot,
                                 "result": str(paths.result), "stop": str(stop)})
    watch = RoundWatch(paths.result, stop, on_round)
    held = launcher.held_launch(specs[0].layout.world_size)
    if held is not None:
        # The search's last launch waits for this: no start-up. Its time since the batch
        # ended (the search's end, this plan) is the round's, charged with its first round.
        watch.started = watch.last = held.since
        report = launcher.wait_held(held, {"rotation": str(schedule)}, timeout_s=timeout_s,
                                    watch=watch)
    else:
        own = launcher.workload
        launcher.workload = _RotationWorkload(schedule, watch)
        try:
            report = launcher._launch(specs[0], paths, timeout_s=timeout_s, members=[])
        finally:
            launcher.workload = own
    watch.poll()  # rounds written just before the exit
    try:
        data = json.loads(paths.result.read_text())
    except (OSError, ValueError):
        data = None
    write_json_atomic(paths.report, {**report.to_dict(), "held": held is not None})
    return RotationOutcome(report, data, max(0.0, time.monotonic() - watch.last),
                           new_launch=held is None)
