"""The confirmation round of the built-in trainer: every round in one launch, in rotation.

Owns three things :mod:`autotune.runner.confirm` asks when the launcher batches the
built-in trainer:

* :func:`plan_rotation`: how many rounds the device budget and the wall-time limit afford
  in one launch, decided before it starts from what the search measured: one start-up
  (the processes, imports and rendezvous of the search's first launch, plus every
  candidate's engine build and warm-up, from the trials' ``timings_s``) and, per round,
  every candidate's ``steps_per_slot`` steps at its trial's median step time, x the world
  size;
* :func:`abba_orders`: each round's order (A B, B A, A B, ...: a drift linear in time
  favours no slot over a pair of rounds);
* :func:`run_rotation`: the launch (``python -m trainer --rotation``,
  :mod:`trainer.rotation`); each round the trainer writes is handed to ``on_round`` while
  the launch goes on, and once ``on_round`` says the verdict is settled the trainer is
  asked to stop (a stop file it reads before each round).

A rotation that cannot hold every engine at once (out of memory) says so: the caller
then measures one candidate per launch.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.launchers.base import Launcher
from autotune.runner.confirm_budget import Allowance
from autotune.spec import StudySpec
from autotune.storage import Storage
from autotune.trial import LaunchReport, TrialPaths, TrialSpec
from autotune.trial.measurement import relative_precision
from autotune.trial.paired import CONFIDENCE, MIN_ROUNDS, ConfirmCandidate
from autotune.util.atomic import write_json_atomic
from autotune.workloads.base import BuiltinWorkload, Placement, ProgressWatch

__all__ = ["RotationPlan", "plan_rotation", "abba_orders", "run_rotation", "rotates",
           "RotationOutcome", "RotationStep", "rotate_rounds", "round_runs", "plan_of",
           "first_step_fits"]

_START_PHASES = ("process_start", "imports", "rendezvous", "device_setup")
_ENGINE_PHASES = ("build", "warmup")


def rotates(launcher: Launcher) -> bool:
    """Whether the round runs in one rotating launch: the built-in trainer, batching."""
    return launcher.batches and launcher.workload.kind == BuiltinWorkload.kind


@dataclass(frozen=True)
class RotationPlan:
    rounds: int
    """Rounds the launch runs at most (ending on a pair; 0: none, see ``refusal``)."""
    steps_per_slot: int
    start_up_device_s: float
    round_device_s: float
    refusal: tuple[str, str] | None = None
    """``("budget" | "timeout", words)`` when not even two rounds fit."""

    @property
    def device_s(self) -> float:
        return self.start_up_device_s + self.rounds * self.round_device_s


def abba_orders(n_candidates: int, first_round: int, rounds: int) -> list[list[int]]:
    """Each round's order of candidate indices: even rounds forwards, odd ones backwards.

    >>> abba_orders(2, 0, 4)
    [[0, 1], [1, 0], [0, 1], [1, 0]]
    >>> abba_orders(3, 1, 2)
    [[2, 1, 0], [0, 1, 2]]
    """
    forwards = list(range(n_candidates))
    return [forwards if n % 2 == 0 else forwards[::-1]
            for n in range(first_round, first_round + rounds)]


def _search_facts(storage: Storage, study_name: str,
                  trial_numbers: list[int]) -> tuple[dict[int, float], float, float]:
    """The candidates' step times, their engines' build + warm-up (s), a launch's
    start-up (s): the largest the search's results recorded."""
    rows = storage.study_measurements(study_name, ("trial_number", "step_time_s", "result_json"))
    step_s: dict[int, float] = {}
    engines: dict[int, float] = {}
    start_up = 0.0
    for number, step, text in ((r["trial_number"], r["step_time_s"], r["result_json"])
                               for r in rows):
        try:
            timings = (json.loads(text) or {}).get("timings_s") or {} if text else {}
        except ValueError:
            timings = {}
        start_up = max(start_up, sum(float(timings.get(p) or 0.0) for p in _START_PHASES))
        if int(number) in trial_numbers:
            if step:
                step_s[int(number)] = float(step)
            engines[int(number)] = sum(float(timings.get(p) or 0.0) for p in _ENGINE_PHASES)
    return step_s, sum(engines.values()), start_up


def plan_rotation(storage: Storage, study_name: str, trial_numbers: list[int], *,
                  allowance: Allowance, spent_device_s: float, rounds_left: int,
                  steps_per_slot: int, first_round: int = 0) -> RotationPlan:
    """The most rounds (even) one rotating launch may run within the bounds, from what
    the search measured (:func:`plan_of`)."""
    step_s, engines_s, start_s = _search_facts(storage, study_name, trial_numbers)
    if len(step_s) < len(trial_numbers):
        # A candidate without a recorded step time: a round costs what a run did.
        round_s = allowance.per_run_device_s * len(trial_numbers) / max(allowance.world_size, 1)
    else:
        round_s = steps_per_slot * sum(step_s.values())
    return plan_of(round_s=round_s, start_up_s=start_s + engines_s, allowance=allowance,
                   spent_device_s=spent_device_s, rounds_left=rounds_left,
                   steps_per_slot=steps_per_slot, first_round=first_round)


def plan_of(*, round_s: float, start_up_s: float, allowance: Allowance,
            spent_device_s: float, rounds_left: int, steps_per_slot: int,
            first_round: int = 0) -> RotationPlan:
    """The plan of a launch whose start-up takes ``start_up_s`` and each round ``round_s``
    wall seconds on ``allowance.world_size`` devices: the most rounds (even, at most
    ``rounds_left``) the budget left and the wall-time limit afford, ending on a pair of
    rounds counted from round 0 (``first_round``: the rounds stored before).

    >>> a = Allowance(budget_device_s=100.0, deadline=None, world_size=4, per_run_device_s=0)
    >>> plan = plan_of(round_s=1.5, start_up_s=10.0, allowance=a, spent_device_s=0.0,
    ...                rounds_left=12, steps_per_slot=3)
    >>> plan.rounds, plan.start_up_device_s, plan.round_device_s, plan.device_s
    (10, 40.0, 6.0, 100.0)
    >>> plan_of(round_s=1.5, start_up_s=10.0, allowance=a, spent_device_s=49.0,
    ...         rounds_left=12, steps_per_slot=3).refusal[0]
    'budget'
    """
    world = max(allowance.world_size, 1)
    start_up, per_round = start_up_s * world, round_s * world
    affordable = rounds_left
    why: tuple[str, str] | None = None
    if allowance.budget_device_s is not None:
        left = allowance.budget_device_s - spent_device_s - start_up
        by_budget = int(left // per_round) if per_round > 0 and left > 0 else 0
        if by_budget < affordable:
            affordable = by_budget
            why = ("budget", f"{spent_device_s:.1f} of {allowance.budget_device_s:.1f} "
                   f"device-s spent, one launch of 2 rounds needs about "
                   f"{start_up + 2 * per_round:.1f} ({start_up:.1f} of them its start-up)")
    if allowance.deadline is not None:
        left_s = allowance.deadline - time.monotonic() - start_up_s
        by_time = int(left_s // round_s) if round_s > 0 and left_s > 0 else 0
        if by_time < affordable:
            affordable = by_time
            why = ("timeout", f"{max(left_s, 0.0):.0f} s of the run's wall-time limit left "
                   f"after a start-up of about {start_up_s:.0f} s")
    # The launch ends on a pair's boundary (a verdict is taken on pairs of rounds).
    affordable = max(affordable - (first_round + affordable) % 2, 0)
    if affordable == 0 or first_round + affordable < 2:
        return RotationPlan(0, steps_per_slot, start_up, per_round, why)
    return RotationPlan(affordable, steps_per_slot, start_up, per_round)


def first_step_fits(spec: StudySpec, storage: Storage, launcher: Launcher,
                    cands: list[ConfirmCandidate], allowance: Allowance) -> bool:
    """Whether a first A B, B A step of ``cands`` fits the bounds: one rotating launch
    with the built-in trainer, else two rounds of runs at their estimated cost."""
    if not rotates(launcher):
        return allowance.refusal(MIN_ROUNDS * len(cands), 0.0) is None
    plan = plan_rotation(storage, spec.name, [c.trial_number for c in cands],
                         allowance=allowance, spent_device_s=0.0,
                         rounds_left=spec.search.confirm_max_rounds,
                         steps_per_slot=max(spec.trial.measure_steps, 1))
    return plan.rounds >= MIN_ROUNDS


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


class _RoundWatch(ProgressWatch):
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
    watch = _RoundWatch(paths.result, stop, on_round)
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
    write_json_atomic(paths.report, report.to_dict())
    return RotationOutcome(report, data, max(0.0, time.monotonic() - watch.last))


def round_runs(data: dict[str, Any], *, number: int, world_size: int, by_trial: dict[str, int],
               launcher: str, worker: str, run_dir: str,
               confidence: float = CONFIDENCE) -> list[dict[str, Any]]:
    """A rotation round's slots as confirmation runs (:data:`~autotune.storage.
    confirmations.RUN_COLUMNS`): each slot ``complete`` with its median step's throughput."""
    runs = []
    for slot in data.get("slots") or []:
        value = slot.get("model_tflops_per_device")
        ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
        # The slot's own interval, as a run's precision; None with fewer steps than an
        # interval at this confidence needs (6 at 95 %; a slot has trial.measure_steps).
        times = [float(t) for t in slot.get("step_times_s") or []]
        runs.append({"round": number, "slot": int(slot["slot"]),
                     "layout_key": slot["layout_key"],
                     "trial_number": by_trial[slot["layout_key"]],
                     "outcome": "complete" if ok else "error",
                     "reason": None if ok else "no step time",
                     "model_tflops_per_device": value if ok else None,
                     "step_time_s": slot.get("step_time_s"),
                     "measure_precision": relative_precision(times, confidence) if ok
                     else None,
                     "elapsed_s": sum(slot.get("step_times_s") or []),
                     "world_size": world_size, "launcher": launcher, "worker": worker,
                     "run_dir": run_dir})
    return runs


@dataclass
class RotationStep:
    runs: list[dict[str, Any]]
    """The rounds' runs, each round recorded as it came (its cost with it)."""
    launches: int
    device_s: float
    refusal: tuple[str, str] | None = None
    """Why no launch started (``budget`` or ``timeout``)."""
    apart: str | None = None
    """Why the candidates must be measured one launch each (they cannot coexist)."""


def rotate_rounds(spec: StudySpec, storage: Storage, launcher: Launcher, confirmation_id: int,
                  trials: dict[str, int], keys: list[str], *, first_round: int,
                  rounds_left: int, allowance: Allowance, spent_device_s: float,
                  worker: str, settles: Callable[[list[dict[str, Any]]], bool]) -> RotationStep:
    """Plan, launch and record one rotation; ``settles(new_runs)``: whether the rounds so
    far (with the stored ones) settle the verdict, asked after every pair of rounds."""
    from dataclasses import replace

    from autotune.layout import Layout
    from autotune.storage import record_round

    steps = max(spec.trial.measure_steps, 1)
    plan = plan_rotation(storage, spec.name, [trials[k] for k in keys], allowance=allowance,
                         spent_device_s=spent_device_s, rounds_left=rounds_left,
                         steps_per_slot=steps, first_round=first_round)
    if plan.rounds == 0:
        return RotationStep([], 0, 0.0, refusal=plan.refusal)
    run_cfg = replace(spec.run_config(None), early_stop_tolerance=None,
                      best_model_tflops_per_device=None)
    specs = [TrialSpec(model=spec.model, layout=Layout.from_key(k), run=run_cfg) for k in keys]
    world = specs[0].layout.world_size
    root = (Path(spec.launcher.run_dir) / spec.name / f"confirm-{confirmation_id:03d}"
            / f"rotation-{first_round:02d}")
    runs: list[dict[str, Any]] = []
    cost = {"launches": 0, "device_s": 0.0}
    settled = [False]

    def on_round(data: dict[str, Any], wall_s: float) -> bool:
        if launcher.cancelled or launcher.abandoned or settled[0]:
            # After a Ctrl-C nothing more is stored: the user asked to stop; after a lost
            # lease (the launch abandoned) the round is another worker's. After the verdict
            # settled, rounds the trainer wrote before it saw the stop file (a slow poll
            # reads several at once) are not stored either: the sequential rule stops at
            # the settling pair, and a round more could unsettle it and cost a launch.
            return True
        number = first_round + len({r["round"] for r in runs})
        new = round_runs(data, number=number, world_size=world, by_trial=trials,
                         launcher=launcher.kind, worker=worker, run_dir=str(root),
                         confidence=run_cfg.confidence)
        first = cost["launches"] == 0
        if not storage.retrying("recording a confirmation round", lambda: record_round(
                storage, confirmation_id, study_name=spec.name, runs=new,
                launches=1 if first else 0, device_s=wall_s * world, worker=worker)):
            launcher.abandon()  # taken over since the last heartbeat: the launch ends now
            return True
        cost["launches"], cost["device_s"] = 1, cost["device_s"] + wall_s * world
        runs.extend(new)
        settled[0] = (number + 1) % 2 == 0 and settles(runs)
        return settled[0]

    timeout = spec.trial.timeout_s * (len(keys) + 1) + 2 * plan.device_s / world
    out = run_rotation(launcher, specs, keys, abba_orders(len(keys), first_round, plan.rounds),
                       steps_per_slot=steps, root=root, timeout_s=timeout, on_round=on_round)
    tail = (out.tail_s if runs else out.report.elapsed_s) * world
    if not launcher.abandoned and not storage.retrying(
            "recording a confirmation round", lambda: record_round(
                storage, confirmation_id, study_name=spec.name, runs=[],
                launches=0 if runs else 1, device_s=tail, worker=worker)):
        launcher.abandon()  # the round is another worker's: its cost is not charged to it
    apart = None
    if not out.coexist and not runs:
        apart = ("the candidates' engines do not fit in memory together: one launch per "
                 "candidate and round instead")
    return RotationStep(runs, 1, cost["device_s"] + tail, apart=apart)
