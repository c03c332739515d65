"""One trial (or several in one launch): validate, build, warm up, measure, write the result.

Each rank's status comes from :func:`result_status_of_exception`: ``ok``, ``oom`` (out of
memory) or ``error``; the result file gets the worst over ranks (an ``oom`` on *any* rank
makes the trial ``oom`` unless another failed otherwise). That file is the trainer's
verdict only: the runner turns it and what the launcher saw into the trial's outcome
(:func:`autotune.trial.classify.classify`). Ranks agree on the status through an
all-reduce (MAX of a status code) in a dedicated gloo group whose timeout is longer than
the process-group timeout, so that a rank that failed early still meets the ranks that
are stuck in a step collective until ``run.collective_timeout_s`` expires. Each failing
rank also writes ``<result>.rank<N>.err`` (JSON) before that, which rank 0 reads to
explain the failure, and which a launcher can read when rank 0 itself is gone.

Exit codes (:func:`run_trials`): 0 all ok, 1 a trial failed (error or oom), 2 a spec was
invalid (nothing ran for it).

Several trials in one launch (a *batch*, :mod:`autotune.launchers.base`): the process group
and the status group are the launch's; each trial builds its own DeepSpeed engine, with
its own topology and groups, and frees it before the next. A trial that every rank agrees
ran out of memory is recorded ``oom``, its memory released, and the next trial runs; after
any other failure the process group may be wedged, so the launch ends there and the trials
after it get no result (the launcher runs them again, each alone).

How long a trial measures (:class:`autotune.trial.measurement.StopRule`): ``measure_steps``
timed steps, or with ``run.measure_precision`` until the median is known that precisely
(at most ``run.step_cap`` steps), and never past the point where it is known to be hopeless
(``run.early_stop_tolerance``: the result says ``early_stopped``). Every rank takes rank 0's
step times (one broadcast per step, outside the timed region), so all stop at the same
step. Where the wall time went is in the result's ``timings_s`` (:mod:`trainer.timeline`).

With ``AUTOTUNE_METRICS_FILE`` set, rank 0 also writes one line per optimizer step (warm-up
steps included) to that file, the contract a foreign workload reports through
(:mod:`autotune.metrics_writer`): the trainer run as a ``command`` workload is read back as
any program of a user's would be.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.feasibility import check_layout
from autotune.metrics_writer import MetricsWriter
from autotune.trial import TrialResult, TrialSpec
from autotune.util.atomic import write_json_atomic
from trainer.distributed import LaunchEnv, launch_env_from
from trainer.launch import (
    LaunchContext,
    agree,
    close_launch,
    error_tail,
    gather,
    raise_terminated,
    rank0_value,
    syncer,
)
from trainer.results import Measured, RankFacts, write_failed, write_ok, write_result
from trainer.status import STATUS_CODES, is_out_of_memory, result_status_of_exception
from trainer.timeline import LAUNCH_TIME_ENV, Timeline

__all__ = ["run_trials", "result_status_of_exception", "is_out_of_memory",
           "STATUS_CODES"]

@dataclass
class _Job:
    spec_path: str
    result_path: str
    spec: TrialSpec | None = None
    error: str | None = None


def _load(job: _Job, world_size: int) -> None:
    """Validate one spec; on failure ``job.error`` names the field(s)."""
    try:
        job.spec = TrialSpec.load(job.spec_path)
    except AutotuneError as err:
        job.error = str(err)
        return
    reasons = check_layout(job.spec.layout, job.spec.model, world_size=world_size)
    if reasons:
        job.error = "layout: " + "; ".join(f"[{r.code}] {r.message}" for r in reasons)
        job.spec = None


def run_trials(pairs: list[tuple[str, str]], env: dict[str, str] | None = None, *,
               hold: tuple[str, float] | None = None) -> int:
    """Run every ``(spec, result)`` pair in order in this process; return the exit code.
    ``hold``: the runner's word file and how long to wait for it once the batch is done
    (:mod:`trainer.hold`)."""
    environ = os.environ if env is None else env
    launch = launch_env_from(environ)
    timeline = Timeline.for_launch(environ)
    jobs = [_Job(s, r) for s, r in pairs]
    for job in jobs:
        _load(job, launch.world_size)
        if job.error is not None and launch.rank == 0:
            write_result(job.result_path, TrialResult(status="error", error=job.error,
                                                      world_size=launch.world_size))
    valid = [j for j in jobs if j.spec is not None]
    if not valid:
        for job in jobs:
            print(f"trainer: invalid spec: {job.error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        ctx = LaunchContext.start(launch, valid[0].spec, timeline,  # type: ignore[arg-type]
                             launch_time=_float_or_none(environ.get(LAUNCH_TIME_ENV)),
                             batch_size=len(valid))
    except Exception as err:  # rendezvous/device failure: nothing ran
        status = result_status_of_exception(err)
        if launch.rank == 0:
            for job in valid:
                write_result(job.result_path, TrialResult(
                    status=status, error=error_tail(err), world_size=launch.world_size))
        print(f"trainer: could not start: {err}", file=sys.stderr)
        return 1
    failed = False
    for index, job in enumerate(valid):
        status = _run_one(job, ctx, timeline if index == 0 else Timeline.now(), index)
        failed = failed or status != "ok"
        if status == "error":  # the process group may be wedged: do not reuse it
            print(f"trainer: trial {index + 1} of {len(valid)} failed; the "
                  f"{len(valid) - index - 1} after it are left to run alone", file=sys.stderr)
            break
    else:
        if hold is not None:
            from trainer.hold import await_word

            schedule = await_word(hold[0], ctx, hold[1])
            if schedule is not None:
                from trainer.rotation import rotate_in_held

                rotated = rotate_in_held(schedule, ctx)
                # The trials' results stand whatever the rotation did; its own file says
                # how it went, and its failure is the launch's exit code.
                return rotated if rotated else (1 if failed else 0)
        close_launch(ctx)
    if failed:
        return 1
    return 2 if len(valid) < len(jobs) else 0


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _run_one(job: _Job, ctx: LaunchContext, timeline: Timeline, index: int) -> str:
    """Run one trial on this rank; rank 0 writes the result. Returns the agreed status."""
    import torch

    from autotune.trial.measurement import StopRule  # the one rule, users' programs' too
    from trainer import distributed
    from trainer.data import MemmapTokens, SyntheticTokens, micro_batches
    from trainer.engine import TrainEngine
    from trainer.measure import StepClock

    spec, launch, device = job.spec, ctx.launch, ctx.device
    assert spec is not None
    run, layout, model = spec.run, spec.layout, spec.model
    err_path = Path(f"{job.result_path}.rank{launch.rank}.err")
    err_path.unlink(missing_ok=True)
    torch.manual_seed(run.seed)
    distributed.set_group_timeout(run.collective_timeout_s)  # for this trial's new groups
    sync = syncer(ctx)
    losses: list[float] = []
    times_s: list[float] = []  # rank 0's, on every rank
    clock, warm = StepClock(sync), StepClock(sync)
    rule = StopRule.of(run, model, layout, launch.world_size,
                       best_tflops=max([*ctx.best_tflops, run.best_model_tflops_per_device
                                        or 0.0]) or None)
    metrics = MetricsWriter(rank=launch.rank)
    tokens = layout.global_batch * model.seq_len
    meter = distributed.energy_meter(device)
    readings = None
    engine = None
    error: BaseException | None = None
    early: str | None = None
    try:
        distributed.reset_peak_memory(device)
        engine = TrainEngine(model, layout, run, device)
        source = (MemmapTokens(run.data_path or "", model.seq_len, run.data_dtype)
                  if run.data == "file" else
                  SyntheticTokens(model.vocab_size, model.seq_len, run.seed))
        timeline.lap("build")
        step = 0
        while True:
            batches = micro_batches(source, step=step, dp=layout.dp, dp_rank=engine.dp_rank,
                                    micro_batch=layout.micro_batch,
                                    grad_accum=layout.grad_accum)
            timed = step >= run.warmup_steps
            timer = clock if timed else warm
            if step == run.warmup_steps:
                meter.start()  # the warm-up's last step ended with a device sync
            with timer.step():
                losses.append(_step(engine, batches, step, run.test_hook, launch))
            metrics.step(step + 1, timer.times_s[-1], tokens=tokens, loss=losses[-1])
            step += 1
            if not timed:
                if step == run.warmup_steps:
                    timeline.lap("warmup")
                continue
            times_s.append(rank0_value(clock.times_s[-1], ctx, rule.adaptive))
            done, early = rule.decide(times_s)
            if done:
                break
        readings = meter.stop()
        timeline.lap("measure")
    except BaseException as err:  # every failure must become a status, never a hang
        if isinstance(err, KeyboardInterrupt):
            raise
        error = err
        write_json_atomic(err_path, {"rank": launch.rank, "host": socket.gethostname(),
                                     "status": result_status_of_exception(err),
                                     "error": error_tail(err)})
        print(f"trainer: rank {launch.rank}: {type(err).__name__}: {str(err)[:1000]}",
              file=sys.stderr)  # the launch's output says why, whichever rank fails first
    metrics.close()
    status = agree(result_status_of_exception(error), ctx)
    # Once every rank agreed, a peer may exit (a failed trial ends its launch), and
    # torchrun then SIGTERMs this rank: the result must still be written (torchrun's
    # SIGKILL follows only after its grace period). Rank 0 still releasing memory when a
    # faster peer left lost its result so (CI, loaded: a failed MiCS trial without one).
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        alloc, reserved = distributed.peak_memory(device)
        n_params = engine.n_params_local if engine is not None else 0
        if engine is not None:
            try:
                engine.close()
            except Exception:
                pass
            engine = None
        distributed.release_memory(device)  # the next trial of the launch starts clean
        batch = (index, ctx.batch_size)
        if status == "ok":
            everyone = gather(RankFacts(socket.gethostname(), n_params, alloc, reserved,
                                          readings), ctx)
            timeline.lap("teardown")
            best = 0.0
            if launch.rank == 0:
                result = write_ok(job.result_path, spec=spec, launch=launch, device=device,
                                  everyone=everyone, timeline=timeline, batch=batch,
                                  launch_time=ctx.launch_time,
                                  measured=Measured(losses, times_s, run.confidence, early))
                if not result.early_stopped and result.model_tflops_per_device:
                    best = result.model_tflops_per_device
            # Every rank keeps the same bar for the launch's next trial; after its last
            # there is none, and a rank 0 that sent and exited would leave a slower peer's
            # receive to fail ("Connection closed by peer").
            best = rank0_value(best, ctx, index + 1 < ctx.batch_size)
            if best > 0:
                ctx.best_tflops.append(best)
        elif launch.rank == 0:
            timeline.lap("teardown")
            write_failed(job.result_path, spec=spec, launch=launch, device=device,
                         status=status, error_tail=error_tail(error, 2000) if error else None,
                         error_is_oom=error is not None and is_out_of_memory(error),
                         losses=losses, timeline=timeline, batch=batch,
                         launch_time=ctx.launch_time)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return status


def _step(engine: Any, batches: Any, step: int, hook: str, launch: LaunchEnv) -> float:
    """One optimizer step, with the failure injections of ``run.test_hook``."""
    import torch

    if hook == "oom" and step == 0 and launch.rank == 0:
        raise torch.OutOfMemoryError("test_hook oom: simulated out of memory on rank 0")
    if hook == "oom_all" and step == 0:
        raise torch.OutOfMemoryError(f"test_hook oom_all: simulated out of memory on rank "
                                     f"{launch.rank}")
    if hook == "die" and step == 0 and launch.rank == 0:
        os._exit(17)  # no result, no error file: what a segfault or the OOM killer leaves
    loss = engine.step(batches)
    if step == 0 and hook == "hang" and launch.rank == 0:
        while True:  # the launcher's timeout must end this
            time.sleep(3600)
    if step == 0 and hook == "crash_rank" and launch.rank == launch.world_size - 1:
        raise RuntimeError(f"test_hook crash_rank: rank {launch.rank} crashed on purpose")
    return loss

