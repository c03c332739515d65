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
* :func:`run_rotation` (:mod:`autotune.runner.rotation_launch`): the launch (``python -m
  trainer --rotation``, :mod:`trainer.rotation`); each round the trainer writes is handed
  to ``on_round`` while the launch goes on, and once ``on_round`` says the verdict is
  settled the trainer is asked to stop (a stop file it reads before each round).

Where the search's last batch was launched held (:mod:`autotune.launchers.held`: the
study's last launch, kept up once its trials wrote their results), the rotation runs in
it: the plan then charges no start-up, only each candidate's engine at what an engine
after a launch's first cost, and the round starts no launch of its own (``launches``: 0).
On the README's demo that is what lets the round run within a quarter of the search's
device-seconds, where a launch's start-up alone cost twice that.

A rotation that cannot hold every engine at once (out of memory) says so: the caller
then measures one candidate per launch.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.launchers.base import Launcher
from autotune.runner.confirm_budget import Allowance
from autotune.runner.rotation_launch import RotationOutcome, run_rotation
from autotune.spec import StudySpec
from autotune.storage import Storage
from autotune.trial import TrialSpec
from autotune.trial.measurement import relative_precision
from autotune.trial.paired import CONFIDENCE, MIN_ROUNDS, ConfirmCandidate
from autotune.workloads.base import BuiltinWorkload

__all__ = ["RotationPlan", "plan_rotation", "abba_orders", "run_rotation", "rotates",
           "RotationOutcome", "RotationStep", "rotate_rounds", "round_runs", "plan_of",
           "first_step_fits", "held_idle_s", "planned_rounds"]

_START_PHASES = ("process_start", "imports", "rendezvous", "device_setup")
_ENGINE_PHASES = ("build", "warmup")
_END_PHASE = "teardown"


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
    end_device_s: float = 0.0
    """Of the start-up, what the launch's end costs (every engine's teardown), which the
    rounds must leave room for."""

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


def _search_facts(storage: Storage, study_name: str, trial_numbers: list[int], *,
                  held: bool = False) -> tuple[dict[int, float], float, float, float]:
    """The candidates' step times, their engines' build + warm-up (s), their teardown at
    the launch's end (s), a launch's start-up (s): the largest the search's results
    recorded. ``held``: the rotation runs
    in the search's held launch (:mod:`autotune.launchers.held`), so there is no start-up,
    and an engine costs what one did after a launch's first: the first trial of a
    launch builds its engine with the launch's one-time costs (kernels, caches) in it,
    which a held launch has paid already; the median of the later ones, per candidate."""
    rows = storage.study_measurements(study_name, ("trial_number", "step_time_s", "result_json"))
    step_s: dict[int, float] = {}
    engines: dict[int, float] = {}
    later: list[float] = []
    ends: list[float] = []
    start_up = 0.0
    for row in rows:
        number, step, result = int(row["trial_number"]), row["step_time_s"], _parsed(
            row["result_json"])
        timings = result.get("timings_s") or {}
        launch_s = sum(float(timings.get(p) or 0.0) for p in _START_PHASES)
        start_up = max(start_up, launch_s)
        engine_s = sum(float(timings.get(p) or 0.0) for p in _ENGINE_PHASES)
        if launch_s == 0.0 and timings:
            later.append(engine_s)
        if timings.get(_END_PHASE) is not None:
            ends.append(float(timings[_END_PHASE]))
        if number in trial_numbers:
            if step:
                # A timed step's wall time as the trial spent it (its syncs, the broadcast
                # of rank 0's time, the next batch's slicing), where the result says.
                times = len(result.get("step_times_s") or [])
                measure_s = float(timings.get("measure") or 0.0)
                step_s[number] = max(float(step), measure_s / times if times else 0.0)
            engines[number] = engine_s
    # Every engine is torn down at the launch's end, as each trial's was.
    end_s = _median(ends) * len(trial_numbers)
    if held:
        each = _median(later) if later else _median(list(engines.values()))
        return step_s, each * len(trial_numbers), end_s, 0.0
    return step_s, sum(engines.values()), end_s, start_up


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def _parsed(text: str | None) -> dict:
    """A stored trial result as a dict; ``{}`` for none or one that does not parse (a
    result from an older version is still a row to count, with nothing to take from it)."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def held_idle_s(launcher: Launcher, world_size: int) -> float | None:
    """How long the search's held launch has waited so far (its time is the round's), or
    ``None`` without one to rotate in."""
    held = launcher.held_launch(world_size)
    return None if held is None else max(0.0, time.monotonic() - held.since)


def plan_rotation(storage: Storage, study_name: str, trial_numbers: list[int], *,
                  allowance: Allowance, spent_device_s: float, rounds_left: int,
                  steps_per_slot: int, first_round: int = 0,
                  held_idle: float | None = None) -> RotationPlan:
    """The most rounds (even) one rotating launch may run within the bounds, from what
    the search measured (:func:`plan_of`); ``held_idle``: in the search's held launch,
    which has waited that long (charged as its start-up, with the engines)."""
    step_s, engines_s, end_s, start_s = _search_facts(storage, study_name, trial_numbers,
                                                      held=held_idle is not None)
    start_s += (held_idle or 0.0) + end_s
    if len(step_s) < len(trial_numbers):
        # A candidate without a recorded step time: a round costs what a run did.
        round_s = allowance.per_run_device_s * len(trial_numbers) / max(allowance.world_size, 1)
    else:
        round_s = steps_per_slot * sum(step_s.values())
    plan = plan_of(round_s=round_s, start_up_s=start_s + engines_s, allowance=allowance,
                   spent_device_s=spent_device_s, rounds_left=rounds_left,
                   steps_per_slot=steps_per_slot, first_round=first_round)
    return replace(plan, end_device_s=end_s * max(allowance.world_size, 1))


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


def planned_rounds(spec: StudySpec, storage: Storage, launcher: Launcher,
                   cands: list[ConfirmCandidate], allowance: Allowance, *, done: int,
                   spent_device_s: float) -> int:
    """The rounds one rotating launch plans (``search.confirm_max_rounds`` at most, fewer
    where the budget affords fewer): what the verdict's looks are counted on, as where
    each run is its own launch (:meth:`~autotune.runner.confirm_budget.Allowance.
    rounds_within`). The cap itself where not even a pair fits (the step's refusal then
    ends the round, as before)."""
    cap = spec.search.confirm_max_rounds
    plan = plan_rotation(storage, spec.name, [c.trial_number for c in cands],
                         allowance=allowance, spent_device_s=spent_device_s,
                         rounds_left=cap - done, steps_per_slot=max(spec.trial.measure_steps, 1),
                         first_round=done,
                         held_idle=held_idle_s(launcher, allowance.world_size))
    return done + plan.rounds if plan.rounds > 0 else cap


def first_step_fits(spec: StudySpec, storage: Storage, launcher: Launcher,
                    cands: list[ConfirmCandidate], allowance: Allowance) -> bool:
    """Whether a first A B, B A step of ``cands`` fits the bounds: one rotating launch
    with the built-in trainer, else two rounds of runs at their estimated cost."""
    if not rotates(launcher):
        return allowance.refusal(MIN_ROUNDS * len(cands), 0.0) is None
    plan = plan_rotation(storage, spec.name, [c.trial_number for c in cands],
                         allowance=allowance, spent_device_s=0.0,
                         rounds_left=spec.search.confirm_max_rounds,
                         steps_per_slot=max(spec.trial.measure_steps, 1),
                         held_idle=held_idle_s(launcher, allowance.world_size))
    return plan.rounds >= MIN_ROUNDS


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
    held: bool = False
    """It ran in the search's held launch (no launch of its own)."""
    budget_spent: bool = False
    """Stopped before a pair the device budget could not pay for, by what its rounds cost:
    the round decides on the rounds measured."""


def rotate_rounds(spec: StudySpec, storage: Storage, launcher: Launcher, confirmation_id: int,
                  trials: dict[str, int], keys: list[str], *, first_round: int,
                  rounds_left: int, allowance: Allowance, spent_device_s: float,
                  worker: str, settles: Callable[[list[dict[str, Any]]], bool]) -> RotationStep:
    """Plan, launch and record one rotation; ``settles(new_runs)``: whether the rounds so
    far (with the stored ones) settle the verdict, asked after every pair of rounds."""
    from autotune.layout import Layout
    from autotune.storage import record_round

    steps = max(spec.trial.measure_steps, 1)
    idle = held_idle_s(launcher, allowance.world_size)
    held = idle is not None
    plan = plan_rotation(storage, spec.name, [trials[k] for k in keys], allowance=allowance,
                         spent_device_s=spent_device_s, rounds_left=rounds_left,
                         steps_per_slot=steps, first_round=first_round, held_idle=idle)
    if plan.rounds == 0:
        return RotationStep([], 0, 0.0, refusal=plan.refusal)
    run_cfg = replace(spec.run_config(None), early_stop_tolerance=None,
                      best_model_tflops_per_device=None)
    specs = [TrialSpec(model=spec.model, layout=Layout.from_key(k), run=run_cfg) for k in keys]
    world = specs[0].layout.world_size
    root = (Path(spec.launcher.run_dir) / spec.name / f"confirm-{confirmation_id:03d}"
            / f"rotation-{first_round:02d}")
    runs: list[dict[str, Any]] = []
    cost = {"launches": 0, "device_s": 0.0, "rounds": 0}
    costs: list[float] = []
    settled, spent = [False], [False]

    def on_round(data: dict[str, Any], wall_s: float) -> bool:
        if launcher.cancelled or launcher.abandoned or settled[0] or spent[0]:
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
        first = cost["rounds"] == 0
        launched = 1 if first and not held else 0  # a held launch is the search's
        if not storage.retrying("recording a confirmation round", lambda: record_round(
                storage, confirmation_id, study_name=spec.name, runs=new,
                launches=launched, device_s=wall_s * world, worker=worker)):
            launcher.abandon()  # taken over since the last heartbeat: the launch ends now
            return True
        cost["launches"] += launched
        cost["rounds"] += 1
        cost["device_s"] += wall_s * world
        costs.append(wall_s * world)
        runs.extend(new)
        settled[0] = (number + 1) % 2 == 0 and settles(runs)
        if not settled[0] and (number + 1) % 2 == 0 and _pair_unaffordable(
                allowance, spent_device_s + cost["device_s"], costs,
                reserve=plan.end_device_s):
            # The plan's estimate was low: what the rounds cost so far says the next pair
            # would pass the budget. The round decides on the rounds paid for.
            spent[0] = True
            return True
        return settled[0]

    timeout = spec.trial.timeout_s * (len(keys) + 1) + 2 * plan.device_s / world
    out = run_rotation(launcher, specs, keys, abba_orders(len(keys), first_round, plan.rounds),
                       steps_per_slot=steps, root=root, timeout_s=timeout, on_round=on_round)
    tail = (out.tail_s if runs else out.report.elapsed_s) * world
    launches = 1 if out.new_launch else 0
    if not launcher.abandoned and not storage.retrying(
            "recording a confirmation round", lambda: record_round(
                storage, confirmation_id, study_name=spec.name, runs=[],
                launches=0 if runs else launches, device_s=tail, worker=worker)):
        launcher.abandon()  # the round is another worker's: its cost is not charged to it
    apart = None
    if not out.coexist and not runs:
        apart = ("the candidates' engines do not fit in memory together: one launch per "
                 "candidate and round instead")
    return RotationStep(runs, launches, cost["device_s"] + tail, apart=apart,
                        held=not out.new_launch, budget_spent=spent[0])


def _pair_unaffordable(allowance: Allowance, spent_device_s: float, costs: list[float], *,
                       reserve: float = 0.0) -> bool:
    """Whether two more rounds, at what the rounds after the first cost (the first also
    carries the engines' build), and then the launch's end would pass the device budget.
    The end is ``reserve`` (the engines' teardown) and the round the trainer may have
    begun before it reads the stop file (it looks between rounds).

    >>> a = Allowance(budget_device_s=10.0, deadline=None, world_size=4, per_run_device_s=0)
    >>> _pair_unaffordable(a, 6.0, [3.0, 1.0]), _pair_unaffordable(a, 8.0, [3.0, 1.0])
    (False, True)
    """
    if allowance.budget_device_s is None or not costs:
        return False
    later = costs[1:] or costs
    per_round = sum(later) / len(later)
    return spent_device_s + 3 * per_round + reserve > allowance.budget_device_s
