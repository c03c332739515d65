"""What the trials of one launch share, on every rank: the process and status groups
(:class:`LaunchContext`), the ranks' agreement on a status, rank 0's values broadcast,
the facts gathered, and the launch's joint end. Read by :mod:`trainer.run` (trials one
after another) and :mod:`trainer.rotation` (every candidate's engine in turn)."""

from __future__ import annotations

import datetime
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from autotune.trial import TrialSpec
from trainer.distributed import LaunchEnv
from trainer.results import RankFacts
from trainer.status import STATUS_CODES, Terminated
from trainer.timeline import Timeline

__all__ = ["LaunchContext", "agree", "close_launch", "syncer", "rank0_value", "gather",
           "raise_terminated", "error_tail"]


def raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum} (the launcher stopped this rank)")


def error_tail(err: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return f"{type(err).__name__}: {err}\n" + text[-limit:]


@dataclass
class LaunchContext:
    """What every trial of a launch shares: rank info, device, status group, the best
    throughput measured so far in this launch (the early stop's bar for later trials)."""

    launch: LaunchEnv
    device: Any  # trainer.distributed.DeviceInfo (imported lazily with torch)
    status_group: Any
    launch_time: float | None = None
    batch_size: int = 1
    best_tflops: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, launch: LaunchEnv, spec: TrialSpec, timeline: Timeline, *,
              launch_time: float | None, batch_size: int) -> LaunchContext:
        from trainer import distributed  # imports torch (seconds): after spec validation

        # DS_ACCELERATOR first: DeepSpeed picks its accelerator once, at import.
        kind = distributed.prepare_environment(spec.run.device)
        import deepspeed  # noqa: F401  (imported here so that its seconds are "imports")

        timeline.lap("imports")
        device = distributed.pick_device(kind, launch.local_rank)
        timeout = spec.run.collective_timeout_s
        timeline.lap("device_setup")
        distributed.init_process_group(launch, device, timeout)
        timeline.lap("rendezvous")
        import torch.distributed as dist

        # Longer than any step collective's timeout: a rank that failed early waits here
        # until the others have timed out of the step and join it.
        status_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(
            seconds=2 * timeout + 30))
        if launch.world_size > 1:
            dist.barrier(group=status_group)  # the communicator is up on every rank
        timeline.lap("device_setup")
        return cls(launch, device, status_group, launch_time, batch_size)


def close_launch(ctx: LaunchContext) -> None:
    """End the launch together: a barrier, then the process groups destroyed, on every rank.

    Without it a rank leaves as soon as its part of the last collective is done: under CPU
    load a peer still waiting to receive from it then fails with gloo's "Connection closed
    by peer" and exits 1 after rank 0 has written an ok result (the pattern
    of pytorch/pytorch#75512, and PyTorch's "Shutdown" advice to call
    ``destroy_process_group`` at the end, docs/source/distributed.rst). In a barrier every
    rank's receive is posted before any rank leaves it. A failure here comes after every
    result was written: it is reported and changes nothing (the results stand)."""
    if ctx.launch.world_size == 1:
        return
    import torch.distributed as dist

    try:
        dist.barrier(group=ctx.status_group)
        dist.destroy_process_group()
    except Exception as err:  # after the results: they stand (docs/trainer.md)
        print(f"trainer: teardown after the last result: {err}", file=sys.stderr)


def syncer(ctx: LaunchContext) -> Any:
    import torch.distributed as dist

    from trainer import distributed

    def sync() -> None:
        distributed.synchronize(ctx.device)
        if ctx.launch.world_size > 1:
            dist.barrier()

    return sync


def rank0_value(value: float, ctx: LaunchContext, needed: bool) -> float:
    """Rank 0's ``value`` on every rank (decisions taken on it must agree everywhere)."""
    if ctx.launch.world_size == 1 or not needed:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(t, src=0, group=ctx.status_group)
    return float(t.item())


def gather(mine: RankFacts, ctx: LaunchContext) -> list[RankFacts]:
    if ctx.launch.world_size == 1:
        return [mine]
    import torch.distributed as dist

    everyone: list[Any] = [None] * ctx.launch.world_size
    dist.all_gather_object(everyone, mine, group=ctx.status_group)
    return everyone


def agree(status: str, ctx: LaunchContext) -> str:
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
