"""One trial (or several in one launch): validate, build, warm up, measure, write the result.

Each rank's status comes from :func:`result_status_of_exception`: ``ok``, ``oom`` (out of
memory) or ``error``; the result file gets the worst over ranks (an ``oom`` on *any* rank
makes the trial ``oom`` unless another failed otherwise). That file is the trainer's
verdict only: the runner turns it and what the launcher saw into the trial's outcome
(:func:`autotune.runner.outcome.classify`). Ranks agree on the status through an
all-reduce (MAX of a status code) in a dedicated gloo group whose timeout is longer than
the process-group timeout, so that a rank that failed early still meets the ranks that
are stuck in a step collective until ``run.collective_timeout_s`` expires. Each failing
rank also writes ``<result>.rank<N>.err`` (JSON) before that, which rank 0 reads to
explain the failure, and which a launcher can read when rank 0 itself is gone.

Exit codes (:func:`run_trials`): 0 all ok, 1 a trial failed (error or oom), 2 a spec was
invalid (nothing ran for it).

With ``AUTOTUNE_METRICS_FILE`` set, rank 0 also writes one line per optimizer step (warm-up
steps included) to that file, the contract a foreign workload reports through
(:mod:`autotune.metrics_writer`): the trainer run as a ``command`` workload is read back as
any program of a user's would be.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.atomic import write_json_atomic
from autotune.errors import AutotuneError
from autotune.feasibility import check_layout
from autotune.metrics_writer import MetricsWriter
from autotune.trial import TrialResult, TrialSpec
from trainer.distributed import LaunchEnv, launch_env_from

__all__ = ["run_trials", "result_status_of_exception", "is_out_of_memory",
           "STATUS_CODES"]

STATUS_CODES = {"ok": 0, "oom": 1, "error": 2}
_PROCESS_START = time.perf_counter()
_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory",
                "failed to allocate")


class Terminated(Exception):
    """SIGTERM arrived (torchrun stops the other ranks when one fails)."""


def is_out_of_memory(err: BaseException) -> bool:
    """True for allocator failures on any device (CUDA/XPU OOM, host ``ENOMEM``)."""
    if isinstance(err, MemoryError):
        return True
    name = type(err).__name__
    if name == "OutOfMemoryError":  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _OOM_MARKERS)


def result_status_of_exception(err: BaseException | None) -> str:
    """The result-file status (:data:`STATUS_CODES`) of a rank whose trial ended with
    ``err`` (``None``: it finished): ``oom`` for an allocator failure, else ``error``."""
    if err is None:
        return "ok"
    return "oom" if is_out_of_memory(err) else "error"


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
    if job.spec.model.dropout > 0:  # the spec would describe a model this trainer cannot run
        job.error = (f"model.dropout: got {job.spec.model.dropout!r}; allowed: 0 (this "
                     "trainer trains without dropout)")
        job.spec = None
        return
    reasons = check_layout(job.spec.layout, job.spec.model, world_size=world_size)
    if reasons:
        job.error = "layout: " + "; ".join(f"[{r.code}] {r.message}" for r in reasons)
        job.spec = None


def run_trials(pairs: list[tuple[str, str]], env: dict[str, str] | None = None) -> int:
    """Run every ``(spec, result)`` pair in order in this process; return the exit code."""
    launch = launch_env_from(os.environ if env is None else env)
    jobs = [_Job(s, r) for s, r in pairs]
    for job in jobs:
        _load(job, launch.world_size)
        if job.error is not None and launch.rank == 0:
            _write(job.result_path, TrialResult(status="error", error=job.error,
                                                world_size=launch.world_size))
    valid = [j for j in jobs if j.spec is not None]
    if not valid:
        for job in jobs:
            print(f"trainer: invalid spec: {job.error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        ctx = _Context.start(launch, valid[0].spec)  # type: ignore[arg-type]
    except Exception as err:  # rendezvous/device failure: nothing ran
        status = result_status_of_exception(err)
        if launch.rank == 0:
            for job in valid:
                _write(job.result_path, TrialResult(status=status, error=_tail(err),
                                                    world_size=launch.world_size))
        print(f"trainer: could not start: {err}", file=sys.stderr)
        return 1
    failed = False
    for job in valid:
        if failed:  # the process group may be wedged after a failure: do not reuse it
            if launch.rank == 0:
                _write(job.result_path, TrialResult(
                    status="error", world_size=launch.world_size,
                    error="not run: an earlier trial of this launch failed"))
            continue
        status = _run_one(job, ctx)
        failed = status != "ok"
    if failed:
        return 1
    return 2 if len(valid) < len(jobs) else 0


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum} (the launcher stopped this rank)")


def _tail(err: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return f"{type(err).__name__}: {err}\n" + text[-limit:]


def _write(path: str, result: TrialResult, extra: dict[str, Any] | None = None) -> None:
    data = result.to_dict()
    data.update(extra or {})
    write_json_atomic(path, data)


@dataclass
class _Context:
    """What every trial of a launch shares: rank info, device, status group."""

    launch: LaunchEnv
    device: Any  # trainer.distributed.DeviceInfo (imported lazily with torch)
    status_group: Any
    first_trial: bool = True

    @classmethod
    def start(cls, launch: LaunchEnv, spec: TrialSpec) -> _Context:
        from trainer import distributed  # imports torch (seconds): after spec validation

        kind = distributed.prepare_environment(spec.run.device)
        device = distributed.pick_device(kind, launch.local_rank)
        timeout = spec.run.collective_timeout_s
        distributed.init_process_group(launch, device, timeout)
        import torch.distributed as dist

        # Longer than any step collective's timeout: a rank that failed early waits here
        # until the others have timed out of the step and join it.
        status_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(
            seconds=2 * timeout + 30))
        return cls(launch, device, status_group)


def _run_one(job: _Job, ctx: _Context) -> str:
    """Run one trial on this rank; rank 0 writes the result. Returns the agreed status."""
    import torch
    import torch.distributed as dist

    from trainer import distributed
    from trainer.data import MemmapTokens, SyntheticTokens, micro_batches
    from trainer.engine import TrainEngine
    from trainer.measure import StepClock

    spec, launch, device = job.spec, ctx.launch, ctx.device
    assert spec is not None
    run, layout, model = spec.run, spec.layout, spec.model
    started = _PROCESS_START if ctx.first_trial else time.perf_counter()
    ctx.first_trial = False
    err_path = Path(f"{job.result_path}.rank{launch.rank}.err")
    err_path.unlink(missing_ok=True)
    torch.manual_seed(run.seed)
    distributed.set_group_timeout(run.collective_timeout_s)  # for this trial's new groups

    def sync() -> None:
        distributed.synchronize(device)
        if launch.world_size > 1:
            dist.barrier()

    losses: list[float] = []
    clock, warm = StepClock(sync), StepClock(sync)
    metrics = MetricsWriter(rank=launch.rank)
    tokens = layout.global_batch * model.seq_len
    engine = None
    error: BaseException | None = None
    try:
        distributed.reset_peak_memory(device)
        engine = TrainEngine(model, layout, run, device)
        source = (MemmapTokens(run.data_path or "", model.seq_len, run.data_dtype)
                  if run.data == "file" else
                  SyntheticTokens(model.vocab_size, model.seq_len, run.seed))
        for step in range(run.warmup_steps + run.measure_steps):
            batches = micro_batches(source, step=step, dp=layout.dp, dp_rank=engine.dp_rank,
                                    micro_batch=layout.micro_batch,
                                    grad_accum=layout.grad_accum)
            timer = warm if step < run.warmup_steps else clock
            with timer.step():
                losses.append(_step(engine, batches, step, run.test_hook, launch))
            metrics.step(step + 1, timer.times_s[-1], tokens=tokens, loss=losses[-1])
    except BaseException as err:  # every failure must become a status, never a hang
        if isinstance(err, KeyboardInterrupt):
            raise
        error = err
        write_json_atomic(err_path, {"rank": launch.rank, "host": socket.gethostname(),
                                     "status": result_status_of_exception(err),
                                     "error": _tail(err)})
    metrics.close()
    status = _agree(result_status_of_exception(error), ctx)
    # A peer that exits now makes torchrun SIGTERM this rank; the result must still be
    # written (torchrun's SIGKILL follows only after its grace period).
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if status == "ok":
            assert engine is not None
            _finish_ok(job, ctx, engine, losses, clock.times_s, started)
        else:
            _finish_failed(job, ctx, status, error, losses, started)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if engine is not None:
        try:
            engine.close()
        except Exception:
            pass
    return status


def _step(engine: Any, batches: Any, step: int, hook: str, launch: LaunchEnv) -> float:
    """One optimizer step, with the failure injections of ``run.test_hook``."""
    import torch

    if hook == "oom" and step == 0 and launch.rank == 0:
        raise torch.OutOfMemoryError("test_hook oom: simulated out of memory on rank 0")
    loss = engine.step(batches)
    if step == 0 and hook == "hang" and launch.rank == 0:
        while True:  # the launcher's timeout must end this
            time.sleep(3600)
    if step == 0 and hook == "crash_rank" and launch.rank == launch.world_size - 1:
        raise RuntimeError(f"test_hook crash_rank: rank {launch.rank} crashed on purpose")
    return loss


def _agree(status: str, ctx: _Context) -> str:
    """The worst status over all ranks; a rank that cannot reach the others says error."""
    if ctx.launch.world_size == 1:
        return status
    import torch
    import torch.distributed as dist

    code = torch.tensor([STATUS_CODES[status]], dtype=torch.int64)
    try:
        dist.all_reduce(code, op=dist.ReduceOp.MAX, group=ctx.status_group)
    except Exception:
        return "oom" if status == "oom" else "error"
    return {v: k for k, v in STATUS_CODES.items()}[int(code.item())]


def _finish_ok(job: _Job, ctx: _Context, engine: Any, losses: list[float],
               times_s: list[float], started: float) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist

    from trainer import distributed
    from trainer.measure import flops_rates, summarize_step_times

    spec, launch, device = job.spec, ctx.launch, ctx.device
    assert spec is not None
    alloc, reserved = distributed.peak_memory(device)
    mine = {"host": socket.gethostname(), "n_params": engine.n_params_local,
            "alloc": alloc, "reserved": reserved}
    everyone: list[Any] = [mine]
    if launch.world_size > 1:
        everyone = [None] * launch.world_size
        dist.all_gather_object(everyone, mine, group=ctx.status_group)
    if launch.rank != 0:
        return
    median_s, iqr_s = summarize_step_times(times_s)
    rates = flops_rates(spec.model, global_batch=spec.layout.global_batch, step_time_s=median_s,
                        world_size=launch.world_size, recompute=spec.layout.recompute == "full",
                        device_name=device.name, dtype=spec.run.dtype)
    reserved_all = [e["reserved"] for e in everyone if e["reserved"] is not None]
    result = TrialResult(
        status="ok", model_tflops_per_device=rates.model_tflops_per_device,
        hardware_tflops_per_device=rates.hardware_tflops_per_device, mfu=rates.mfu,
        step_time_s=median_s, step_times_s=times_s, tokens_per_s=rates.tokens_per_s,
        peak_memory_bytes=max(e["alloc"] for e in everyone), losses=losses,
        world_size=launch.world_size, device=device.kind, step_time_iqr_s=iqr_s,
        peak_memory_reserved_bytes=max(reserved_all) if reserved_all else None,
        device_name=device.name, n_params_per_rank=max(e["n_params"] for e in everyone),
        versions={"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                  "python": sys.version.split()[0]},
        hosts=sorted({e["host"] for e in everyone}), layout=spec.layout.to_dict(),
        elapsed_s=time.perf_counter() - started,
    )
    _write(job.result_path, result, {
        "n_params_per_rank_all": [e["n_params"] for e in everyone],
        # Which host each global rank ran on: with the layout's rank order it says where
        # every TP group and pipeline stage was placed (a TP group crossing nodes shows).
        "rank_hosts": [e["host"] for e in everyone],
        "model_flops_per_step": rates.model_flops_per_step,
        "peak_flops_per_device": rates.peak_flops,
        "global_batch": spec.layout.global_batch,
        "tokens_per_step": spec.layout.global_batch * spec.model.seq_len,
        "dtype": spec.run.dtype, "launcher": launch.launcher,
        "model": spec.model.to_dict(),
    })


def _finish_failed(job: _Job, ctx: _Context, status: str, error: BaseException | None,
                   losses: list[float], started: float) -> None:
    launch = ctx.launch
    if launch.rank != 0:
        return
    found: list[tuple[int, str]] = []  # (rank, message)
    if error is not None:
        found.append((0, _tail(error, 2000)))
    for path in sorted(glob.glob(f"{glob.escape(job.result_path)}.rank*.err")):
        try:
            info = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if info.get("rank") == 0:
            continue
        if info.get("status") == "oom":
            status = "oom"
        found.append((int(info.get("rank", -1)),
                       f"({info.get('host')}) {str(info.get('error'))[:2000]}"))
    if error is not None and is_out_of_memory(error):
        status = "oom"
    # Root causes first: a rank that timed out waiting for a peer is a consequence.
    found.sort(key=lambda item: ("timed out" in item[1].lower() or "terminated" in
                                 item[1].lower(), item[0]))
    messages = [f"rank {rank}: {msg}" for rank, msg in found] or [
        "another rank failed or could not be reached (no error file)"]
    result = TrialResult(status=status, error="\n".join(messages)[:8000], losses=losses,
                         world_size=launch.world_size, device=ctx.device.kind,
                         device_name=ctx.device.name,
                         layout=job.spec.layout.to_dict() if job.spec else None,
                         elapsed_s=time.perf_counter() - started)
    _write(job.result_path, result)
