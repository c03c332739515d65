"""The trial result (output of ``python -m trainer``): one JSON file, written atomically.

The keys are a contract other programs rely on (``docs/trainer.md``, "The result"): extend,
never rename. The file is tagged ``status: ok | oom | error`` (:data:`STATUSES`) and travels
as one file written atomically (temp file + rename, as submitit does); nobody greps logs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.errors import SpecError
from autotune.trial.numbers import check_result_numbers
from autotune.util.atomic import write_json_atomic

__all__ = ["TrialResult", "Status", "STATUSES", "PHASES", "read_result"]

Status = Literal["ok", "oom", "error"]
STATUSES: tuple[str, ...] = ("ok", "oom", "error")
PHASES: tuple[str, ...] = ("process_start", "imports", "rendezvous", "device_setup", "build",
                           "warmup", "measure", "teardown")
"""The phases a trial's wall time is broken into (``timings_s`` of the result; docs/trainer.md,
"Where the time goes"). The first four are the launch's: in a batch they are paid once, by
its first trial, and are 0 in the others."""


@dataclass
class TrialResult:
    """What a trial measured. Keys as in ``docs/trainer.md`` ("The result")."""

    status: str
    model_tflops_per_device: float | None = None
    hardware_tflops_per_device: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    losses: list[float] = field(default_factory=list)
    world_size: int | None = None
    device: str | None = None
    error: str | None = None
    # Extensions (never renamed keys above).
    step_time_iqr_s: float | None = None
    """Interquartile range of the timed step times (the spread)."""
    peak_memory_reserved_bytes: int | None = None
    device_name: str | None = None
    n_params_per_rank: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    layout: dict[str, Any] | None = None
    elapsed_s: float | None = None
    """Wall time of the whole trial process, launch to result."""
    timings_s: dict[str, float] = field(default_factory=dict)
    """Where the wall time went, seconds per phase of :data:`PHASES` (``process_start``:
    from the launcher's launch to the trainer's first line)."""
    wall_clock: dict[str, float] = field(default_factory=dict)
    """Unix times: ``launch`` (the launcher's, when it said), ``started`` (this trial's
    first phase began), ``result`` (the result was written)."""
    batch_index: int | None = None
    """Position of the trial in its launch (0: the first, which paid the start-up)."""
    batch_size: int | None = None
    """Trials in the launch."""
    measure_precision: float | None = None
    """The relative precision the median step time reached (``None``: too few steps for
    an interval at ``measure_confidence``)."""
    measure_confidence: float | None = None
    early_stopped: bool = False
    """Stopped before ``measure_steps``/the precision: hopeless (``early_stop_reason``)."""
    early_stop_reason: str | None = None
    energy_j_per_step: float | None = None
    """Joules per optimizer step over the trial's devices (each physical counter once);
    ``None``: no counter measured it (never 0 for "not measured")."""
    energy_source: str | None = None
    """The counter: ``nvml``, ``hwmon``, ``rapl`` or ``sacct``; ``None`` with no figure."""
    joules_per_token: float | None = None
    model_tflops_per_watt: float | None = None
    """Model FLOPs per step / energy per step / 1e12."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys a (newer) trainer wrote that this schema does not name: kept, not dropped."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise SpecError("result.status", self.status, f"allowed: one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("extra"))
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> TrialResult:
        if not isinstance(data, dict):
            raise SpecError("result", data, "expected a JSON object", source=source)
        known = set(cls.__dataclass_fields__) - {"extra"}
        # Unknown keys are kept aside: a newer trainer may extend the result.
        extra = {k: v for k, v in data.items() if k not in known}
        try:
            # Before anything is built from it: a number that cannot be stored or ranked
            # is the trial's error, never a runner crash.
            check_result_numbers(data)
            return cls(**{k: v for k, v in data.items() if k in known}, extra=extra)
        except TypeError as err:
            raise SpecError("result", data.get("status"), f"malformed ({err})",
                            source=source) from None
        except SpecError as err:
            raise SpecError(err.field, err.value, err.allowed, source=source) from None

    def write(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(path, self.to_dict())


def read_result(path: str | os.PathLike[str]) -> TrialResult | None:
    """The result at ``path``, ``None`` when there is none (the trial crashed first)."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        raw = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecError("result", str(p), f"not valid JSON ({err})") from None
    except RecursionError:
        raise SpecError("result", str(p), "not valid JSON (nested too deeply)") from None
    return TrialResult.from_dict(raw, source=str(p))


