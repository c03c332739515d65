"""The trial spec (input of ``python -m trainer``) and the trial result (its output).

The keys are a contract other programs rely on (documented in ``docs/trainer.md``, "The
spec" and "The result"): extend, never rename. The result travels as one JSON file written
atomically (temp file + rename, as submitit does) and tagged ``status: ok | oom | error``;
nobody greps logs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.atomic import write_json_atomic
from autotune.config._fields import check_choice, check_float, check_int, check_keys
from autotune.config.model import ModelConfig
from autotune.errors import SpecError
from autotune.layout import Layout
from autotune.result_numbers import check_result_numbers

__all__ = ["RunConfig", "TrialSpec", "TrialResult", "TrialPaths", "Status",
           "read_result"]

Status = Literal["ok", "oom", "error"]
STATUSES: tuple[str, ...] = ("ok", "oom", "error")
DTYPES: tuple[str, ...] = ("fp32", "bf16")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "xpu")
DATA_KINDS: tuple[str, ...] = ("synthetic", "file")
TEST_HOOKS: tuple[str, ...] = ("none", "hang", "crash_rank", "oom", "oom_all",
                                 "die")
MAX_MEASURE_STEPS = 100_000
PHASES: tuple[str, ...] = ("process_start", "imports", "rendezvous", "device_setup", "build",
                           "warmup", "measure", "teardown")
"""The phases a trial's wall time is broken into (``timings_s`` of the result; docs/trainer.md,
"Where the time goes"). The first four are the launch's: in a batch they are paid once, by
its first trial, and are 0 in the others."""


@dataclass(frozen=True)
class RunConfig:
    """How a trial runs (the ``run`` object of a trial spec)."""

    warmup_steps: int = 1
    """Optimizer steps run before timing starts (compilation, allocator warm-up)."""
    measure_steps: int = 3
    """Timed optimizer steps; the result reports their median and spread. With
    ``measure_precision`` set: the fewest timed steps."""
    measure_precision: float | None = None
    """Measure until the median step time is known to this relative precision (half-width
    of its distribution-free confidence interval over the median,
    :func:`autotune.measurement.relative_precision`) or ``max_measure_steps`` is reached;
    ``None``: exactly ``measure_steps`` steps."""
    max_measure_steps: int | None = None
    """The most timed steps with ``measure_precision`` (``None``: 4 x ``measure_steps``)."""
    confidence: float = 0.95
    """Confidence of the precision's interval and of the early stop's bound."""
    early_stop_tolerance: float | None = None
    """Stop the trial once its median step time is, at ``confidence``, too long for its
    throughput to come within this fraction of ``best_model_tflops_per_device`` (or of the
    best trial measured before it in the same launch); ``None``: never."""
    best_model_tflops_per_device: float | None = None
    """The study's best throughput when the trial was launched (the early stop's bar)."""
    dtype: str = "fp32"
    """``fp32`` or ``bf16``."""
    seed: int = 1234
    device: str = "auto"
    """``auto`` picks xpu, then cuda, then cpu."""
    data: str = "synthetic"
    """``synthetic`` (deterministic random tokens) or ``file`` (a Megatron-style .bin)."""
    data_path: str | None = None
    """Token file for ``data: file``."""
    data_dtype: str = "uint16"
    """Token width of the data file: ``uint16`` or ``uint32``."""
    collective_timeout_s: int = 300
    """Process-group timeout, so that a dead rank cannot block the others forever."""
    test_hook: str = "none"
    """Failure injection for tests: ``hang``, ``crash_rank``, ``oom`` (rank 0), ``oom_all``
    (every rank: the launch goes on with its next trial), ``die`` (rank 0's
    process exits at once, as a segfault would end it) -- never in studies."""

    @property
    def step_cap(self) -> int:
        """The most timed steps this run may take."""
        if self.measure_precision is None:
            return self.measure_steps
        return max(self.measure_steps, self.max_measure_steps or 4 * self.measure_steps)

    def __post_init__(self) -> None:
        check_int("run.warmup_steps", self.warmup_steps, minimum=0)
        check_int("run.measure_steps", self.measure_steps, minimum=1)
        if self.measure_precision is not None:
            check_float("run.measure_precision", self.measure_precision, strict=True,
                        maximum=1.0)
        if self.max_measure_steps is not None:
            check_int("run.max_measure_steps", self.max_measure_steps,
                      maximum=MAX_MEASURE_STEPS)
        if not 0.5 <= check_float("run.confidence", self.confidence, maximum=0.9999):
            raise SpecError("run.confidence", self.confidence, "allowed: 0.5 to 0.9999")
        if self.early_stop_tolerance is not None:
            check_float("run.early_stop_tolerance", self.early_stop_tolerance, maximum=0.99)
        if self.best_model_tflops_per_device is not None:
            check_float("run.best_model_tflops_per_device", self.best_model_tflops_per_device,
                        strict=True)
        check_choice("run.dtype", self.dtype, DTYPES)
        check_int("run.seed", self.seed, minimum=0)
        check_choice("run.device", self.device, DEVICES)
        check_choice("run.data", self.data, DATA_KINDS)
        check_choice("run.data_dtype", self.data_dtype, ("uint16", "uint32"))
        check_int("run.collective_timeout_s", self.collective_timeout_s)
        check_choice("run.test_hook", self.test_hook, TEST_HOOKS)
        if self.data == "file" and not self.data_path:
            raise SpecError("run.data_path", self.data_path, "required when run.data is 'file'")

    @classmethod
    def from_dict(cls, data: Any) -> RunConfig:
        names = [f for f in cls.__dataclass_fields__]
        return cls(**check_keys("run", data, names))


@dataclass(frozen=True)
class TrialSpec:
    """Everything one trial needs: the model, the layout and how to run it."""

    model: ModelConfig
    layout: Layout
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        model = self.model.to_dict()
        return {"model": model, "layout": self.layout.to_dict(), "run": asdict(self.run)}

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> TrialSpec:
        try:
            data = check_keys("spec", data, ("model", "layout", "run"))
            for key in ("model", "layout"):
                if key not in data:
                    raise SpecError(key, None, "required section is missing")
            return cls(model=ModelConfig.from_dict(data["model"]),
                       layout=Layout.from_dict(data["layout"]),
                       run=RunConfig.from_dict(data.get("run", {})))
        except SpecError as err:
            raise SpecError(err.field, err.value, err.allowed, source=source) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrialSpec:
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SpecError("--spec", str(path), "no such file") from None
        except json.JSONDecodeError as err:
            raise SpecError("spec", str(path), f"not valid JSON ({err})") from None
        return cls.from_dict(raw, source=str(path))


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
            # is the trial's error, never a runner crash (issue 23, D/E).
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


@dataclass(frozen=True)
class TrialPaths:
    """The on-disk layout of one trial, defined once (submitit's ``JobPaths``): the launchers
    write it, the workloads and the exporter read it, so it lives beside the spec and result
    it holds rather than in the launcher package."""

    root: Path
    batch: tuple[TrialPaths, ...] = ()
    """The other trials run in the same launch as this one, after it (a batch: this
    directory holds the launch's logs)."""

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def stdout(self) -> Path:
        return self.root / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.root / "stderr.log"

    @property
    def report(self) -> Path:
        return self.root / "launch.json"

    @property
    def metrics(self) -> Path:
        """A foreign program's metrics file (``$AUTOTUNE_METRICS_FILE``)."""
        return self.root / "metrics.jsonl"

    @property
    def ds_config(self) -> Path:
        """A foreign program's DeepSpeed config (``{ds_config}``)."""
        return self.root / "ds_config.json"

    def rank_errors(self) -> list[Path]:
        """Error files a failing rank leaves beside the result (``result.json.rank3.err``)."""
        return sorted(self.root.glob("result.json.rank*.err"))

    def prepare(self) -> None:
        """Create the directory; clear what a previous attempt left (a retry starts clean)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in (self.result, self.report, self.metrics, *self.rank_errors()):
            stale.unlink(missing_ok=True)

    @classmethod
    def for_trial(cls, run_dir: str | Path, study: str, number: int, key: str) -> TrialPaths:
        return cls(Path(run_dir) / study / f"trial-{number:05d}-{key}")
