"""The result file of one trial: what rank 0 writes, atomically, when a trial ends.

Only rank 0 writes (:mod:`autotune.trial` has the schema; ``docs/trainer.md``, "The
result"); every rank takes part in gathering what it reports (peak memory, parameter
count, host). A failed trial's result names every failing rank's error, root causes first
(a rank that timed out waiting for a peer is a consequence, not a cause).
"""

from __future__ import annotations

import glob
import json
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.trial import PHASES, TrialResult, TrialSpec
from autotune.trial.measurement import relative_precision
from autotune.util.atomic import write_json_atomic
from trainer.distributed import LaunchEnv
from trainer.energy import total_j
from trainer.timeline import Timeline

__all__ = ["RankFacts", "Measured", "write_result", "write_ok", "write_failed",
           "energy_figures"]


def write_result(path: str, result: TrialResult, extra: dict[str, Any] | None = None) -> None:
    data = result.to_dict()
    data.update(extra or {})
    write_json_atomic(path, data)


@dataclass(frozen=True)
class RankFacts:
    """What one rank knows of its trial, gathered to rank 0."""

    host: str
    n_params: int
    alloc: int
    reserved: int | None
    energy: list[Any] | None = None
    """What this rank's energy counters measured over the timed steps
    (:class:`trainer.energy.Reading`; ``None``: no counter)."""


@dataclass(frozen=True)
class Measured:
    """What the timed loop produced (rank 0's step times, shared with every rank)."""

    losses: list[float]
    times_s: list[float]
    confidence: float
    early_stop_reason: str | None = None


def _batch_facts(timeline: Timeline, batch: tuple[int, int],
                 launch_time: float | None) -> dict[str, Any]:
    wall = {"started": timeline.started_wall, "result": time.time()}
    if launch_time is not None:
        wall["launch"] = launch_time
    return {"timings_s": timeline.breakdown(PHASES), "wall_clock": wall,
            "batch_index": batch[0], "batch_size": batch[1]}


def energy_figures(total: tuple[float, str] | None, n_steps: int, *, flops_per_step: float,
                   tokens_per_step: int) -> dict[str, Any]:
    """The result's energy keys from the timed steps' joules over all devices
    (``None``: not measured; every key ``None`` then, never 0):

    * ``energy_j_per_step`` = joules / timed steps;
    * ``joules_per_token`` = ``energy_j_per_step`` / tokens per step;
    * ``model_tflops_per_watt`` = model FLOPs per step / ``energy_j_per_step`` / 1e12
      (FLOP/s per W is FLOP per J; the Green500's GFLOPS/W with model FLOPs).

    >>> f = energy_figures((60.0, "rapl"), 3, flops_per_step=4e12, tokens_per_step=1000)
    >>> f["energy_j_per_step"], f["joules_per_token"], f["model_tflops_per_watt"]
    (20.0, 0.02, 0.2)
    """
    if total is None or n_steps < 1 or total[0] <= 0:
        return {"energy_j_per_step": None, "energy_source": None, "joules_per_token": None,
                "model_tflops_per_watt": None}
    per_step = total[0] / n_steps
    return {"energy_j_per_step": per_step, "energy_source": total[1],
            "joules_per_token": per_step / tokens_per_step,
            "model_tflops_per_watt": flops_per_step / per_step / 1e12}


def write_ok(path: str, *, spec: TrialSpec, launch: LaunchEnv, device: Any,
             everyone: list[RankFacts], measured: Measured, timeline: Timeline,
             batch: tuple[int, int], launch_time: float | None) -> TrialResult:
    """Rank 0: the ``ok`` result of a trial (an early-stopped one too: it measured)."""
    import deepspeed
    import torch

    from trainer.measure import flops_rates, summarize_step_times

    times_s = measured.times_s
    median_s, iqr_s = summarize_step_times(times_s)
    rates = flops_rates(spec.model, global_batch=spec.layout.global_batch, step_time_s=median_s,
                        world_size=launch.world_size, recompute=spec.layout.recompute,
                        device_name=device.name, dtype=spec.run.dtype)
    reserved_all = [e.reserved for e in everyone if e.reserved is not None]
    energy = energy_figures(total_j(e.energy for e in everyone), len(times_s),
                            flops_per_step=rates.model_flops_per_step,
                            tokens_per_step=spec.layout.global_batch * spec.model.seq_len)
    result = TrialResult(
        status="ok", model_tflops_per_device=rates.model_tflops_per_device,
        hardware_tflops_per_device=rates.hardware_tflops_per_device, mfu=rates.mfu,
        step_time_s=median_s, step_times_s=times_s, tokens_per_s=rates.tokens_per_s,
        peak_memory_bytes=max(e.alloc for e in everyone), losses=measured.losses,
        world_size=launch.world_size, device=device.kind, step_time_iqr_s=iqr_s,
        peak_memory_reserved_bytes=max(reserved_all) if reserved_all else None,
        device_name=device.name, n_params_per_rank=max(e.n_params for e in everyone),
        versions={"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                  "python": sys.version.split()[0]},
        hosts=sorted({e.host for e in everyone}), layout=spec.layout.to_dict(),
        elapsed_s=sum(timeline.phases.values()),
        measure_precision=relative_precision(times_s, measured.confidence),
        measure_confidence=measured.confidence,
        early_stopped=measured.early_stop_reason is not None,
        early_stop_reason=measured.early_stop_reason, **energy,
        **_batch_facts(timeline, batch, launch_time),
    )
    write_result(path, result, {
        "n_params_per_rank_all": [e.n_params for e in everyone],
        # Which host each global rank ran on: with the layout's rank order it says where
        # every TP group and pipeline stage was placed (a TP group crossing nodes shows).
        "rank_hosts": [e.host for e in everyone],
        "model_flops_per_step": rates.model_flops_per_step,
        "peak_flops_per_device": rates.peak_flops,
        "global_batch": spec.layout.global_batch,
        "tokens_per_step": spec.layout.global_batch * spec.model.seq_len,
        "dtype": spec.run.dtype, "launcher": launch.launcher,
        "model": spec.model.to_dict(),
    })
    return result


def write_failed(path: str, *, spec: TrialSpec, launch: LaunchEnv, device: Any, status: str,
                 error_tail: str | None, error_is_oom: bool, losses: list[float],
                 timeline: Timeline, batch: tuple[int, int],
                 launch_time: float | None) -> None:
    """Rank 0: the ``oom``/``error`` result, with every failing rank's error file read."""
    found: list[tuple[int, str]] = []  # (rank, message)
    if error_tail is not None:
        found.append((0, error_tail))
    for err_path in sorted(glob.glob(f"{glob.escape(path)}.rank*.err")):
        try:
            info = json.loads(Path(err_path).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if info.get("rank") == 0:
            continue
        if info.get("status") == "oom":
            status = "oom"
        found.append((int(info.get("rank", -1)),
                      f"({info.get('host')}) {str(info.get('error'))[:2000]}"))
    if error_is_oom:
        status = "oom"
    found.sort(key=lambda item: ("timed out" in item[1].lower() or "terminated" in
                                 item[1].lower(), item[0]))
    messages = [f"rank {rank}: {msg}" for rank, msg in found] or [
        "another rank failed or could not be reached (no error file)"]
    result = TrialResult(status=status, error="\n".join(messages)[:8000], losses=losses,
                         world_size=launch.world_size, device=device.kind,
                         device_name=device.name, layout=spec.layout.to_dict(),
                         elapsed_s=sum(timeline.phases.values()),
                         **_batch_facts(timeline, batch, launch_time))
    write_result(path, result)


def rank_facts(n_params: int, alloc: int, reserved: int | None) -> RankFacts:
    return RankFacts(host=socket.gethostname(), n_params=n_params, alloc=alloc,
                     reserved=reserved)
