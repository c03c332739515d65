"""Honest measurement of a trial: step timing, throughput, FLOPs rates, memory.

How a figure is obtained (``docs/trainer.md`` has the full table):

* Step time: ``warmup_steps`` optimizer steps run untimed (allocator warm-up, DeepSpeed's
  first-step set-up, pipeline shape exchange), then each of ``measure_steps`` steps is
  bracketed by a device synchronisation and a barrier on every rank, so that a step
  lasts until its slowest rank is done. Reported: every step time, the **median**
  (``step_time_s``) and the interquartile range (``step_time_iqr_s``), never the best.
* ``tokens_per_s = global_batch * seq_len / step_time_s``.
* ``model_tflops_per_device = model_flops_per_step / (step_time_s * world_size) / 1e12``
  (:func:`autotune.models.flops.tflops_per_device`)
  with :func:`autotune.models.flops.model_flops_per_step` (Narayanan et al. 2021, eq. 3,
  without the recompute forward; PaLM's model FLOPs).
* ``hardware_tflops_per_device``: the same with
  :func:`autotune.models.flops.hardware_flops_per_step`, which adds the recompute forward.
* ``mfu = model_tflops_per_device * 1e12 / peak`` with the dense peak of the device for
  the trial's dtype (:func:`autotune.hardware.peak_flops_for_device_name`); ``None`` when
  the peak is unknown (CPUs).
* How many steps (:class:`autotune.trial.measurement.StopRule`): exactly ``measure_steps``; or, with
  ``run.measure_precision``, at least ``measure_steps`` and until the distribution-free
  confidence interval of the median (:func:`autotune.trial.measurement.relative_precision`) is
  that narrow, at most ``run.step_cap``; and, with ``run.early_stop_tolerance`` and a best
  throughput to compare with, stopped as soon as the median's lower confidence bound
  shows the layout cannot come within the tolerance of the best
  (:func:`autotune.trial.measurement.hopeless`). The achieved precision is in the result.
* Memory: the accelerator's peak allocated (and reserved) bytes since the trial started;
  on CPU the peak resident set of the process. The result holds the max over ranks.

>>> [round(x, 6) for x in summarize_step_times([0.3, 0.1, 0.2, 0.4])]
[0.25, 0.15]
>>> r = flops_rates(ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=32, vocab_size=128),
...                 global_batch=8, step_time_s=0.5, world_size=2, recompute=False,
...                 device_name="cpu", dtype="fp32")
>>> r.tokens_per_s, r.mfu
(512.0, None)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from autotune.config.model import ModelConfig
from autotune.hardware import peak_flops_for_device_name
from autotune.models.flops import (
    hardware_flops_per_step,
    model_flops_per_step,
    tflops_per_device,
)

__all__ = ["StepClock", "summarize_step_times", "FlopsRates", "flops_rates"]


class StepClock:
    """Times steps between two synchronisation points.

    ``sync`` waits for the device and all ranks (device synchronise, then a barrier); on a
    single process it is just the device synchronise.
    """

    def __init__(self, sync: Callable[[], None]):
        self.sync = sync
        self.times_s: list[float] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        yield
        self.sync()
        self.times_s.append(time.perf_counter() - start)


def summarize_step_times(times_s: list[float]) -> tuple[float, float]:
    """(median, interquartile range) of step times in seconds."""
    arr = np.asarray(times_s, dtype=float)
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return float(med), float(q3 - q1)


@dataclass(frozen=True)
class FlopsRates:
    tokens_per_s: float
    model_flops_per_step: float
    model_tflops_per_device: float
    hardware_tflops_per_device: float
    mfu: float | None
    peak_flops: float | None


def flops_rates(model: ModelConfig, *, global_batch: int, step_time_s: float, world_size: int,
                recompute: bool | str, device_name: str, dtype: str) -> FlopsRates:
    """Throughput figures of a step of ``step_time_s`` seconds (formulas in the docstring)."""
    model_flops = model_flops_per_step(model, global_batch)
    hw_flops = hardware_flops_per_step(model, global_batch, recompute=recompute)
    model_tflops = tflops_per_device(model_flops, step_time_s, world_size)
    peak = peak_flops_for_device_name(device_name, dtype)
    return FlopsRates(
        tokens_per_s=global_batch * model.seq_len / step_time_s,
        model_flops_per_step=model_flops,
        model_tflops_per_device=model_tflops,
        hardware_tflops_per_device=tflops_per_device(hw_flops, step_time_s, world_size),
        mfu=None if peak is None else model_tflops * 1e12 / peak,
        peak_flops=peak,
    )
