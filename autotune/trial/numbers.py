"""The numbers of a trial result, checked before anything of them is stored.

A result file is another program's output: the trainer's, or the one a foreign workload's
read-back builds from a metrics file or log lines (:mod:`autotune.workloads.readback`).
Whatever it holds, a number the study stores or ranks by must be a real number of the right
type, finite and in range: a ``{"seconds": 1e-300}`` metrics line would make an infinite
throughput that no JSON writer accepts (the runner crashes, the trial stays RUNNING), an
``Infinity`` in the result file would be recorded COMPLETE and named the best layout, and a
``"fast"`` would reach a comparison as a ``TypeError``.

:func:`check_result_numbers` raises :class:`~autotune.errors.SpecError` naming the field
(``result.step_times_s[2]``) and the value; the loaders turn it into an ``error`` outcome
(:func:`autotune.trial.read_result`, the foreign workloads' ``finish``). The other fields'
types are checked too (a list where the error text belongs reached ``str.strip``); the
``status`` is the dataclass's to check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotune.errors import SpecError
from autotune.hardware import MAX_TFLOPS_PER_DEVICE

__all__ = ["check_result_numbers", "POSITIVE", "NON_NEGATIVE", "COUNTS", "TEXTS",
           "MAX_TFLOPS_PER_DEVICE"]

POSITIVE: tuple[str, ...] = ("model_tflops_per_device", "hardware_tflops_per_device", "mfu",
                             "step_time_s", "tokens_per_s")
"""Fields that are a finite number > 0 when present (``null`` allowed, but not for
``model_tflops_per_device`` of an ``ok`` result: it is the score)."""
NON_NEGATIVE: tuple[str, ...] = ("step_time_iqr_s", "peak_memory_bytes",
                                 "peak_memory_reserved_bytes", "elapsed_s",
                                 "measure_precision", "measure_confidence")
"""Fields that are a finite number >= 0 when present (a spread of identical steps is 0; the
trainer reports no memory as 0 on some devices)."""
COUNTS: tuple[str, ...] = ("world_size", "n_params_per_rank", "batch_index", "batch_size")
"""Fields that are an integer >= 0 when present."""
TEXTS: tuple[str, ...] = ("error", "device", "device_name", "early_stop_reason")
"""Fields that are a string when present."""
_MAX_DEPTH = 32
"""Nesting followed into ``extra`` (deeper is refused: a result is a flat record)."""


def _real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _number(field: str, value: Any, *, strict: bool) -> None:
    low = "> 0" if strict else ">= 0"
    if not _real(value) or not _finite(value) or not (value > 0 if strict else value >= 0):
        raise SpecError(field, value, f"allowed: a finite number {low}")


def _all_finite(field: str, value: Any, depth: int = 0) -> None:
    """Every number inside ``value`` (lists, objects) finite: what a strict JSON writer and
    a database column accept."""
    if depth > _MAX_DEPTH:
        raise SpecError(field, "...", f"allowed: at most {_MAX_DEPTH} levels of nesting")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, value, "allowed: a finite number")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _all_finite(f"{field}.{key}", item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _all_finite(f"{field}[{i}]", item, depth + 1)


def check_result_numbers(data: Mapping[str, Any]) -> None:
    """Refuse a result whose numbers cannot be stored or ranked (module docstring); fields
    are named ``result.<key>``."""
    for key in POSITIVE:
        value = data.get(key)
        if value is not None:
            _number(f"result.{key}", value, strict=True)
    for key in ("model_tflops_per_device", "hardware_tflops_per_device"):
        value = data.get(key)
        if value is not None and value > MAX_TFLOPS_PER_DEVICE:
            raise SpecError(f"result.{key}", value, "allowed: a finite number > 0 and <= "
                            f"{MAX_TFLOPS_PER_DEVICE:g} (more is no device's throughput)")
    if data.get("status") == "ok" and data.get("model_tflops_per_device") is None:
        raise SpecError("result.model_tflops_per_device", None,
                        "required when status is 'ok': a finite number > 0")
    for key in NON_NEGATIVE:
        value = data.get(key)
        if value is not None:
            _number(f"result.{key}", value, strict=False)
    for key in COUNTS:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise SpecError(f"result.{key}", value, "allowed: an integer >= 0")
    times = data.get("step_times_s")
    if times is not None:
        if not isinstance(times, list):
            raise SpecError("result.step_times_s", times, "allowed: a list of step times")
        for i, t in enumerate(times):
            _number(f"result.step_times_s[{i}]", t, strict=True)
    losses = data.get("losses")
    if losses is not None:
        if not isinstance(losses, list):
            raise SpecError("result.losses", losses, "allowed: a list of numbers")
        for i, loss in enumerate(losses):
            if not _real(loss) or not _finite(loss):
                raise SpecError(f"result.losses[{i}]", loss, "allowed: a finite number")
    for key in ("timings_s", "wall_clock"):
        section = data.get(key)
        if section is None:
            continue
        if not isinstance(section, Mapping):
            raise SpecError(f"result.{key}", section, "allowed: an object of numbers")
        for name, value in section.items():
            _number(f"result.{key}.{name}", value, strict=False)
    for key in TEXTS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise SpecError(f"result.{key}", value, "allowed: a string")
    if not isinstance(data.get("early_stopped", False), bool):
        raise SpecError("result.early_stopped", data["early_stopped"], "allowed: true or false")
    hosts = data.get("hosts")
    if hosts is not None and not (isinstance(hosts, list)
                                  and all(isinstance(h, str) for h in hosts)):
        raise SpecError("result.hosts", hosts, "allowed: a list of host names")
    for key in ("versions", "layout", "extra"):
        value = data.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise SpecError(f"result.{key}", value, "allowed: an object")
    versions = data.get("versions") or {}
    if not all(isinstance(v, str) for v in versions.values()):
        raise SpecError("result.versions", versions, "allowed: an object of version strings")
    for key, value in data.items():
        _all_finite(f"result.{key}", value)
