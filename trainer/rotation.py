"""Several candidates' engines in one launch, measured in rotation (the confirmation round).

``python -m trainer --rotation SCHEDULE.json`` (under the same launchers as a trial). The
schedule (written by :mod:`autotune.runner.confirm_rotation`) names one trial spec per
candidate (all of one world size), the order of every round (indices into the specs: A B,
then B A, ...), ``steps_per_slot`` and where the result goes:

``{"specs": [...], "keys": [...], "rounds": [[0, 1], [1, 0], ...], "steps_per_slot": 3,
"result": "...", "stop": "..."}``

Every candidate's engine is built once, in these processes (each with its own topology
and groups, from its own seed, as a trial builds it), and warmed up by its own
``run.warmup_steps``; then each round runs every candidate in the round's order for
``steps_per_slot`` timed steps (between the same device sync and barrier as a trial's, rank
0's times taken by every rank). Candidates measured seconds apart see the same machine: a
drift moves all of them alike, which separate launches do not. No early stop applies:
every slot runs all its steps.

After every round rank 0 rewrites the result file atomically (``kind: rotation``, ``status:
running`` and the rounds so far; ``ok`` once the schedule or a stop ended it), so that the
runner can decide while the launch goes on. Before each round rank 0 looks for the
``stop`` file (the runner writes it once the verdict is settled) and every rank takes its
answer, so that all leave together. Candidates that cannot coexist (an engine that runs
out of memory while the others are held) end the launch with ``status: oom`` and
``coexist: false``: the runner then measures one candidate per launch.

Exit codes: 0 the rotation ended (schedule or stop), 1 it failed, 2 an invalid schedule.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.feasibility import check_layout
from autotune.trial import TrialSpec
from autotune.util.atomic import write_json_atomic
from trainer.distributed import launch_env_from
from trainer.launch import (
    LaunchContext,
    agree,
    close_launch,
    error_tail,
    raise_terminated,
    rank0_value,
    syncer,
)
from trainer.status import result_status_of_exception
from trainer.timeline import LAUNCH_TIME_ENV, Timeline

__all__ = ["run_rotation", "rotate_in", "rotate_in_held", "RESULT_KIND"]

RESULT_KIND = "rotation"


def _load(schedule_path: str, world_size: int) -> tuple[dict[str, Any], list[TrialSpec]]:
    """The schedule and its specs; :class:`ValueError` names what is wrong."""
    try:
        schedule = json.loads(Path(schedule_path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"--rotation {schedule_path}: cannot read the schedule: {err}") from err
    for field in ("specs", "keys", "rounds", "steps_per_slot", "result"):
        if field not in schedule:
            raise ValueError(f"--rotation: schedule field {field!r} missing")
    steps = schedule["steps_per_slot"]
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--rotation: steps_per_slot: got {steps!r}; allowed: an integer >= 1")
    specs: list[TrialSpec] = []
    for path in schedule["specs"]:
        try:
            spec = TrialSpec.load(path)
        except AutotuneError as err:
            raise ValueError(f"--rotation: spec {path}: {err}") from err
        reasons = check_layout(spec.layout, spec.model, world_size=world_size)
        if reasons:
            raise ValueError(f"--rotation: spec {path}: layout: "
                             + "; ".join(f"[{r.code}] {r.message}" for r in reasons))
        specs.append(spec)
    for n, order in enumerate(schedule["rounds"]):
        if sorted(order) != list(range(len(specs))):
            raise ValueError(f"--rotation: rounds[{n}]: got {order!r}; allowed: every "
                             f"candidate index 0..{len(specs) - 1} once")
    return schedule, specs


def run_rotation(schedule_path: str, env: dict[str, str] | None = None) -> int:
    """Build every candidate's engine, rotate through the schedule; the exit code."""
    environ = os.environ if env is None else env
    launch = launch_env_from(environ)
    try:
        schedule, specs = _load(schedule_path, launch.world_size)
    except ValueError as err:
        print(f"trainer: invalid rotation: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, raise_terminated)
    timeline = Timeline.for_launch(environ)
    launch_time = environ.get(LAUNCH_TIME_ENV)
    try:
        ctx = LaunchContext.start(launch, specs[0], timeline,
                             launch_time=float(launch_time) if launch_time else None,
                             batch_size=1)
    except Exception as err:  # rendezvous/device failure: nothing ran
        if launch.rank == 0:
            write_json_atomic(str(schedule["result"]), {
                **_head(schedule, launch.world_size),
                "status": result_status_of_exception(err), "error": error_tail(err, 2000)})
        return 1
    return rotate_in(schedule, specs, ctx, timeline)


def rotate_in_held(schedule_path: str, ctx: LaunchContext) -> int:
    """The rotation in a launch held after its batch (:mod:`trainer.hold`): its groups
    are the batch's, so only the engines are built here. The exit code."""
    try:
        schedule, specs = _load(schedule_path, ctx.launch.world_size)
    except ValueError as err:
        print(f"trainer: invalid rotation: {err}", file=sys.stderr)
        return 2
    return rotate_in(schedule, specs, ctx, Timeline.now())


def _head(schedule: dict[str, Any], world_size: int) -> dict[str, Any]:
    return {"kind": RESULT_KIND, "status": "running", "keys": schedule["keys"],
            "world_size": world_size, "steps_per_slot": schedule["steps_per_slot"],
            "rounds": []}


def rotate_in(schedule: dict[str, Any], specs: list[TrialSpec], ctx: LaunchContext,
              timeline: Timeline) -> int:
    """Build the engines on ``ctx``'s groups and rotate; the exit code (the launch is
    closed once the rotation ended well)."""
    result = str(schedule["result"])
    out = _head(schedule, ctx.launch.world_size)
    engines: list[tuple[Any, Any]] = []
    error: BaseException | None = None
    try:
        _build(specs, ctx, engines)
    except BaseException as err:  # every failure must become a status, never a hang
        if isinstance(err, KeyboardInterrupt):
            raise
        error = err
    status = agree(result_status_of_exception(error), ctx)
    timeline.lap("build")
    if status != "ok":
        if ctx.launch.rank == 0:
            write_json_atomic(result, {**out, "status": status, "coexist": status != "oom",
                                       "built": len(engines),
                                       "error": error_tail(error, 2000) if error else
                                       "another rank failed building the engines"})
        return 1
    out["timings_s"] = {"start_up": round(sum(timeline.phases.values()), 3)}
    status = _rotate(schedule, specs, engines, ctx, out, result)
    if status == "ok":
        close_launch(ctx)
    return 0 if status == "ok" else 1


def _build(specs: list[TrialSpec], ctx: LaunchContext, built: list[tuple[Any, Any]]) -> None:
    """Every candidate's engine and token source into ``built`` (so that a failure leaves
    the count of those built), each warmed up by its own warm-up steps."""
    import torch

    from trainer import distributed
    from trainer.data import MemmapTokens, SyntheticTokens, micro_batches
    from trainer.engine import TrainEngine

    for spec in specs:
        run, layout, model = spec.run, spec.layout, spec.model
        if run.test_hook == "oom_coexist" and built:
            # What a device too small for every candidate's engine at once raises.
            raise torch.OutOfMemoryError("test_hook oom_coexist: the next engine does not "
                                         "fit beside the others")
        torch.manual_seed(run.seed)
        distributed.set_group_timeout(run.collective_timeout_s)
        engine = TrainEngine(model, layout, run, ctx.device)
        source = (MemmapTokens(run.data_path or "", model.seq_len, run.data_dtype)
                  if run.data == "file" else
                  SyntheticTokens(model.vocab_size, model.seq_len, run.seed))
        built.append((engine, source))
        for step in range(max(run.warmup_steps, 1)):
            engine.step(micro_batches(source, step=step, dp=layout.dp, dp_rank=engine.dp_rank,
                                      micro_batch=layout.micro_batch,
                                      grad_accum=layout.grad_accum))


def _rotate(schedule: dict[str, Any], specs: list[TrialSpec], engines: list[tuple[Any, Any]],
            ctx: LaunchContext, out: dict[str, Any], result: str) -> str:
    """The schedule's rounds; rank 0 rewrites ``result`` after each. The agreed status."""
    from trainer.data import micro_batches
    from trainer.measure import StepClock, flops_rates, summarize_step_times

    rank = ctx.launch.rank
    stop = schedule.get("stop")
    steps = int(schedule["steps_per_slot"])
    step_of = [max(s.run.warmup_steps, 1) for s in specs]
    clock = StepClock(syncer(ctx))
    error: BaseException | None = None
    ended = "schedule"
    try:
        for n, order in enumerate(schedule["rounds"]):
            asked = 1.0 if rank == 0 and stop and Path(stop).exists() else 0.0
            if rank0_value(asked, ctx, True) > 0:
                ended = "stopped"
                break
            slots = []
            for slot, index in enumerate(order):
                engine, source = engines[index]
                spec = specs[index]
                layout = spec.layout
                times: list[float] = []
                for _ in range(steps):
                    batches = micro_batches(source, step=step_of[index], dp=layout.dp,
                                            dp_rank=engine.dp_rank,
                                            micro_batch=layout.micro_batch,
                                            grad_accum=layout.grad_accum)
                    step_of[index] += 1
                    with clock.step():
                        engine.step(batches)
                    times.append(rank0_value(clock.times_s[-1], ctx, True))
                median, _ = summarize_step_times(times)
                rates = flops_rates(spec.model, global_batch=layout.global_batch,
                                    step_time_s=median, world_size=ctx.launch.world_size,
                                    recompute=layout.recompute, device_name=ctx.device.name,
                                    dtype=spec.run.dtype)
                slots.append({"slot": slot, "layout_key": schedule["keys"][index],
                              "step_times_s": times, "step_time_s": median,
                              "model_tflops_per_device": rates.model_tflops_per_device})
            out["rounds"].append({"round": n, "slots": slots})
            if rank == 0:
                write_json_atomic(result, out)
    except BaseException as err:  # every failure must become a status, never a hang
        if isinstance(err, KeyboardInterrupt):
            raise
        error = err
    status = agree(result_status_of_exception(error), ctx)
    if rank == 0:
        final = {**out, "status": status, "ended": ended if status == "ok" else "failed"}
        if error is not None:
            final["error"] = error_tail(error, 2000)
        write_json_atomic(result, final)
    # The engines are not closed one by one (a trial's teardown, with its gc pass): a
    # rotation is its launch's last work, whose processes exit next (trainer.__main__'s
    # _leave), and the round pays for every second until then.
    return status
