"""Reading a foreign program's steps back, and scoring them: the one module for both.

Sources, in order of preference (the first that holds a step is used):

1. the **metrics file** (``$AUTOTUNE_METRICS_FILE``; :mod:`autotune.metrics_writer`): JSON
   lines ``{"step", "seconds", ["tokens", "peak_memory_bytes", "loss"]}``; a line that is
   not such an object is skipped and counted (``garbage_lines``), never fatal;
2. **Megatron-DeepSpeed's iteration line** in the program's output, in either fork's words
   (:data:`ADAPTERS`), with its memory report line;
3. **DeepSpeed PipelineEngine's** ``steps: N loss: ... iter time (s): ...`` line.

The score stays autotune's (:func:`measure`): the first ``drop`` steps are warm-up (the first
logged interval includes start-up), the median of the rest is the step time, and model
TFLOPS per device come from the study's model and global batch through
:func:`autotune.models.flops.model_flops_per_step`, the builtin workload's formula, so that
scores compare across workloads. What the program says of its own TFLOPS (one fork counts
recompute, the other does not) is kept as an extra, never the score.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autotune.errors import SpecError
from autotune.layout import Layout
from autotune.models.flops import (
    hardware_flops_per_step,
    model_flops_per_step,
    tflops_per_device,
)
from autotune.trial import TrialResult
from autotune.workloads.log_text import strip_ansi

__all__ = ["StepRecord", "Readback", "ADAPTERS", "read_metrics_file", "parse_log_line",
           "read_back", "measure", "step_of_line", "record_of_line", "best_source",
           "SOURCES", "StepCounter", "MAX_LOG_BYTES"]

MAX_LOG_BYTES = 64 << 20
"""Most bytes of one log or metrics file read back (a trial prints a few KiB a step)."""
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_FLOAT_OR_NAN = rf"(?:{_NUM}|nan|inf)"

# -- Megatron-DeepSpeed, deepspeedai fork -------------------------------------------------
# deepspeedai/Megatron-DeepSpeed megatron/training.py, training_log() (commit
# f1feb8877d760b4ceaa0551debbf1cb4026fc9be), printed by print_rank_last (the last rank):
#   ' iteration {:8d}/{:8d} |' ... ' elapsed time per iteration (ms): {:.1f} |' ...
#   ' {}: {:.6E} |'.format(key, avg)  (key 'lm loss') ... ' TFLOPs: {:.2f} |'
DEEPSPEEDAI_ITERATION = re.compile(
    r"\biteration\s+(?P<step>\d+)/\s*(?P<total>\d+)\s*\|.*?"
    rf"elapsed time per iteration \(ms\):\s*(?P<ms>{_NUM})")
DEEPSPEEDAI_LOSS = re.compile(rf"\|\s*lm loss:\s*(?P<loss>{_FLOAT_OR_NAN})")
DEEPSPEEDAI_TFLOPS = re.compile(rf"\|\s*TFLOPs:\s*(?P<tflops>{_NUM})")
# -- Megatron-DeepSpeed, argonne-lcf fork --------------------------------------------------
# argonne-lcf/Megatron-DeepSpeed megatron/training_log.py, training_log() (commit
# b8413d98abdb30c87e607b21a663e4bfcb6c8da2; the same in megatron/training.py at
# eb8e570dbc949914a6fee5437dc6ea31f11eee95), logged by rank 0 (log.info):
#   f" iteration={iteration:8d}/{args.train_iters:8d} |" ...
#   " elapsed_time_per_iteration_ms=" f"{elapsed_time_per_iteration * 1000.0:.1f} |" ...
#   " {}={:.6f} |".format(key, avg) ... " [LM]TFLOPs={:.2f} |" " [DS]TFLOPs={:.2f} |"
# Older versions printed "[LM]-TFLOPs=" / "[DS]-TFLOPs=" (logs quoted in
# saforem2/Megatron-DeepSpeed ALCF/README.md, commit 027032123c2c630da2e755e4381427ab170bdba3).
ARGONNE_ITERATION = re.compile(
    r"\biteration=\s*(?P<step>\d+)/\s*(?P<total>\d+)\s*\|.*?"
    rf"elapsed_time_per_iteration_ms=(?P<ms>{_NUM})")
ARGONNE_LOSS = re.compile(rf"\|\s*lm loss=(?P<loss>{_FLOAT_OR_NAN})")
ARGONNE_TFLOPS = re.compile(rf"(?:\[(?P<kind>LM|DS)\]-?)?TFLOPs=(?P<tflops>{_NUM})")
# -- Megatron's memory report (both forks) ---------------------------------------------------
# deepspeedai/Megatron-DeepSpeed megatron/utils.py, report_memory() (commit
# 207b2d5aad1eea98464c37e0b991be6f8937226f), after the first iteration, data-parallel rank 0:
#   "[Rank {}] {}".format(rank, name + ' memory (MB)' + ' | allocated: {}' +
#   ' | max allocated: {}' + ' | reserved: {}' + ' | max reserved: {}')
MEGATRON_MEMORY = re.compile(
    rf"\[Rank (?P<rank>\d+)\] .*?memory \(MB\) \| allocated: (?P<alloc>{_NUM}) \| "
    rf"max allocated: (?P<max_alloc>{_NUM})")
# -- DeepSpeed PipelineEngine -----------------------------------------------------------------
# deepspeedai/DeepSpeed deepspeed/runtime/pipe/engine.py, PipelineEngine.train_batch (commit
# e787c16394e5d50a4b869386e4e4017d6b06f8eb), global rank 0, every steps_per_print steps:
#   f'steps: {self.global_steps} loss: {self.agg_train_loss:0.4f} ' ...
#   f'iter time (s): {iter_time:0.3f} samples/sec: {tput:0.3f}'
DEEPSPEED_PIPE = re.compile(
    rf"\bsteps: (?P<step>\d+) loss: (?P<loss>{_FLOAT_OR_NAN}) .*?"
    rf"iter time \(s\): (?P<seconds>{_NUM}) samples/sec:")

ADAPTERS: dict[str, str] = {
    "megatron-deepspeedai": "deepspeedai/Megatron-DeepSpeed training_log (last rank)",
    "megatron-argonne": "argonne-lcf/Megatron-DeepSpeed training_log (rank 0)",
    "deepspeed-pipe": "DeepSpeed PipelineEngine.train_batch (rank 0)",
}
"""Log formats read, by source name (``metrics-file`` is the preferred source)."""
SOURCES: tuple[str, ...] = ("metrics-file", *ADAPTERS)
"""Every source, in order of preference (module docstring)."""


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as a program reported it."""

    step: int
    seconds: float
    source: str
    tokens: float | None = None
    peak_memory_bytes: float | None = None
    loss: float | None = None
    program_tflops: dict[str, float] = field(default_factory=dict)
    """The program's own figures, e.g. ``{"TFLOPs": 38.6}`` or ``{"[LM]TFLOPs": 49.7}``."""


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _json_number(value: Any) -> float | None:
    """A JSON number as a finite float; ``None`` for anything else (an integer too large
    for a float included: ``math.isfinite`` raised ``OverflowError`` on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _metrics_record(line: str) -> StepRecord | None:
    """A metrics-file line as a step, ``None`` when it is not a valid one."""
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    step, seconds = data.get("step"), data.get("seconds")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    seconds = _json_number(seconds)
    if seconds is None or seconds <= 0:
        return None

    def number(key: str) -> float | None:
        return _json_number(data.get(key))

    return StepRecord(step=step, seconds=seconds, source="metrics-file",
                      tokens=number("tokens"), peak_memory_bytes=number("peak_memory_bytes"),
                      loss=number("loss"))


def _read_text(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - MAX_LOG_BYTES))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_metrics_file(path: Path) -> tuple[list[StepRecord], int]:
    """The steps of a metrics file and how many of its non-empty lines were garbage
    (unreadable, or a step already given)."""
    records: list[StepRecord] = []
    seen: set[int] = set()
    garbage = 0
    for line in _read_text(path).splitlines():
        if not line.strip():
            continue
        rec = _metrics_record(line)
        if rec is None or rec.step in seen:
            garbage += 1
            continue
        seen.add(rec.step)
        records.append(rec)
    return records, garbage


def parse_log_line(line: str) -> StepRecord | tuple[str, float] | None:
    """A step from one log line (:data:`ADAPTERS`), or ``("max_allocated_bytes", n)`` for a
    Megatron memory report, or ``None``. The numbers are as printed (a step time of 0.0 ms
    included): :func:`measure` judges them."""
    try:
        return _parse_log_line(strip_ansi(line))  # argonne-lcf's rich colours (log_text)
    except ValueError:  # a step number of more digits than int() converts (4300)
        return None


def _parse_log_line(line: str) -> StepRecord | tuple[str, float] | None:
    if "iteration" in line:
        m = DEEPSPEEDAI_ITERATION.search(line)
        if m:
            loss = DEEPSPEEDAI_LOSS.search(line)
            tflops = DEEPSPEEDAI_TFLOPS.search(line)
            return StepRecord(int(m["step"]), float(m["ms"]) / 1000.0, "megatron-deepspeedai",
                              loss=_float(loss["loss"]) if loss else None,
                              program_tflops={"TFLOPs": float(tflops["tflops"])}
                              if tflops else {})
        m = ARGONNE_ITERATION.search(line)
        if m:
            loss = ARGONNE_LOSS.search(line)
            figures = {f"[{t['kind']}]TFLOPs" if t["kind"] else "TFLOPs": float(t["tflops"])
                       for t in ARGONNE_TFLOPS.finditer(line)}
            return StepRecord(int(m["step"]), float(m["ms"]) / 1000.0, "megatron-argonne",
                              loss=_float(loss["loss"]) if loss else None,
                              program_tflops=figures)
    if "memory (MB)" in line:
        m = MEGATRON_MEMORY.search(line)
        # "1e400" parses to inf, which no byte count is: such a line measured nothing.
        mib = _float(m["max_alloc"]) if m else None
        if mib is not None and mib >= 0 and math.isfinite(mib * 1024.0 * 1024.0):
            return "max_allocated_bytes", mib * 1024.0 * 1024.0
    if "iter time (s)" in line:
        m = DEEPSPEED_PIPE.search(line)
        if m and float(m["seconds"]) > 0:
            return StepRecord(int(m["step"]), float(m["seconds"]), "deepspeed-pipe",
                              loss=_float(m["loss"]))
    return None


def record_of_line(line: str) -> StepRecord | None:
    """The step a log or metrics line reports (what the watches follow), else ``None``."""
    if line.lstrip().startswith("{"):
        return _metrics_record(line)
    parsed = parse_log_line(line)
    return parsed if isinstance(parsed, StepRecord) else None


def step_of_line(line: str) -> tuple[str, int] | None:
    """``(source, step)`` when a log or metrics line reports a step (what the no-progress
    watch counts), else ``None``."""
    rec = record_of_line(line)
    return None if rec is None else (rec.source, rec.step)


@dataclass
class Readback:
    """What a foreign trial reported, from its best source."""

    records: list[StepRecord]
    """One per step, in step order (the first record of a step wins)."""
    source: str | None
    """``metrics-file``, a key of :data:`ADAPTERS`, or ``None`` (nothing read)."""
    drop: int
    """Warm-up steps dropped before the median."""
    garbage_lines: int = 0
    """Metrics-file lines skipped (not a step, or a repeated step)."""
    log_peak_memory_bytes: float | None = None

    @property
    def steady(self) -> list[StepRecord]:
        return self.records[self.drop:]

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "steps": len(self.records), "dropped":
                min(self.drop, len(self.records)), "measured": len(self.steady),
                "garbage_lines": self.garbage_lines}


def _first_per_step(records: Iterable[StepRecord]) -> list[StepRecord]:
    by_step: dict[int, StepRecord] = {}
    for rec in records:
        by_step.setdefault(rec.step, rec)
    return [by_step[k] for k in sorted(by_step)]


def read_back(metrics: Path, logs: Iterable[Path], *, drop: int) -> Readback:
    """Every step a trial reported, from its best source (module docstring)."""
    records, garbage = read_metrics_file(metrics)
    log_records: dict[str, list[StepRecord]] = {name: [] for name in ADAPTERS}
    peak: float | None = None
    for path in logs:
        for line in _read_text(path).splitlines():
            parsed = parse_log_line(line)
            if isinstance(parsed, StepRecord):
                log_records[parsed.source].append(parsed)
            elif parsed is not None:
                peak = max(peak or 0.0, parsed[1])
    log_records["metrics-file"] = records
    name = best_source({k: len(v) for k, v in log_records.items()})
    if name is None:
        return Readback([], None, drop, garbage, peak)
    return Readback(_first_per_step(log_records[name]), name, drop, garbage, peak)


def best_source(steps: dict[str, int]) -> str | None:
    """The first source of :data:`SOURCES` that holds a step (``steps``: steps per source),
    or ``None``: what :func:`read_back` reads and what :class:`StepCounter` measures."""
    return next((name for name in SOURCES if steps.get(name)), None)


def measure(rb: Readback, *, model: Any, layout: Layout, dtype: str, device: str,
            peak_flops: float | None, expected_steps: int) -> TrialResult | None:
    """The trial's result from its steady-state steps (``None`` when there are none):
    median step time, model and hardware TFLOPS per device with autotune's FLOPs functions,
    the program's own TFLOPS as extras. A steady step time that is not a finite number > 0
    raises :class:`~autotune.errors.SpecError` naming the step; the caller checks the
    result's numbers (:func:`autotune.trial.numbers.check_result_numbers`)."""
    steady = rb.steady
    if not steady:
        return None
    for i, rec in enumerate(steady):
        # A step printed as 0.0 ms, or one of 1e-300 s, would divide to no or an infinite
        # throughput: the program's number is refused, by name.
        if not (math.isfinite(rec.seconds) and rec.seconds > 0):
            raise SpecError(f"step_times_s[{i}] (step {rec.step}, from {rec.source})",
                            rec.seconds, "allowed: a finite step time > 0 s")
    times = [r.seconds for r in steady]
    q1, median_s, q3 = (float(x) for x in np.percentile(times, [25, 50, 75]))
    world = layout.world_size
    flops = model_flops_per_step(model, layout.global_batch)
    hw = hardware_flops_per_step(model, layout.global_batch, recompute=layout.recompute)
    model_tflops = tflops_per_device(flops, median_s, world)
    peaks = [r.peak_memory_bytes for r in rb.records if r.peak_memory_bytes is not None]
    peak_mem = max(peaks) if peaks else rb.log_peak_memory_bytes
    program: dict[str, list[float]] = {}
    for rec in steady:
        for name, value in rec.program_tflops.items():
            program.setdefault(name, []).append(value)
    tokens = [r.tokens / r.seconds for r in steady if r.tokens]
    extra: dict[str, Any] = {
        "readback": rb.summary(), "expected_steps": expected_steps,
        "all_step_times_s": [r.seconds for r in rb.records],
        "model_flops_per_step": flops, "global_batch": layout.global_batch,
        "tokens_per_step": layout.global_batch * model.seq_len, "dtype": dtype,
        # A figure printed as 0.00 (Megatron prints two decimals: "TFLOPs: {:.2f}") is
        # below the program's precision, not zero: it is named, never stored as 0.0.
        "program_tflops_per_device": {k: float(np.median(v)) for k, v in program.items()
                                      if max(v) > 0},
    }
    below = sorted(k for k, v in program.items() if max(v) <= 0)
    if below:
        extra["program_tflops_below_printed_precision"] = below
    if tokens:
        extra["program_tokens_per_s"] = float(np.median(tokens))
    return TrialResult(
        status="ok", model_tflops_per_device=model_tflops,
        hardware_tflops_per_device=tflops_per_device(hw, median_s, world),
        mfu=None if peak_flops is None else model_tflops * 1e12 / peak_flops,
        step_time_s=median_s, step_times_s=times, step_time_iqr_s=q3 - q1,
        tokens_per_s=layout.global_batch * model.seq_len / median_s,
        peak_memory_bytes=int(peak_mem) if peak_mem is not None else None,
        losses=[r.loss for r in rb.records if r.loss is not None], world_size=world,
        device=device, layout=layout.to_dict(), extra=extra)


class StepCounter:
    """Follows the steps files report as they grow (the no-progress watch, the adaptive
    measurement): reads only what was appended since the last call, whole lines only."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.paths = list(paths)
        self._offsets = {p: 0 for p in self.paths}
        self._partial = {p: b"" for p in self.paths}
        self._seen: dict[str, dict[int, StepRecord]] = {}

    @property
    def steps(self) -> int:
        """Distinct steps of the source that reported most of them."""
        return max((len(s) for s in self._seen.values()), default=0)

    def records(self) -> list[StepRecord]:
        """The steps of the preferred source so far (:func:`best_source`: the one
        :func:`read_back` reads once the trial ended), in step order, the first record of a
        step kept."""
        name = best_source({k: len(v) for k, v in self._seen.items()})
        return [] if name is None else [self._seen[name][k] for k in sorted(self._seen[name])]

    def update(self) -> bool:
        """Read what was appended; whether a step not seen before was among it."""
        new = False
        for path in self.paths:
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._offsets[path])
                    chunk = fh.read(MAX_LOG_BYTES)
            except OSError:
                continue
            self._offsets[path] += len(chunk)
            *lines, self._partial[path] = (self._partial[path] + chunk).split(b"\n")
            for raw in lines:
                rec = record_of_line(raw.decode("utf-8", errors="replace"))
                if rec is not None and rec.step not in self._seen.setdefault(rec.source, {}):
                    self._seen[rec.source][rec.step] = rec
                    new = True
        return new
