"""The trial spec: the input of ``python -m trainer`` (model, layout, how it runs).

The keys are a contract other programs rely on (``docs/trainer.md``, "The spec"): extend,
never rename. The ``run`` object's defaults are the study file's ``trial`` defaults
(:mod:`autotune.config.run_defaults`): one set, so a hand-written spec measures as a
study's trial does.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.config import run_defaults as defaults
from autotune.config._fields import check_choice, check_float, check_int, check_keys
from autotune.config.model import ModelConfig
from autotune.errors import SpecError
from autotune.layout import Layout

__all__ = ["RunConfig", "TrialSpec", "DTYPES", "DATA_KINDS", "TEST_HOOKS"]

DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")
"""``fp16`` reaches only a replayed study's trials (``training.dtype``); the DeepSpeed
config every launched workload starts from refuses it (:func:`autotune.dsconfig.
batch_config`)."""
DATA_KINDS: tuple[str, ...] = ("synthetic", "file")
TEST_HOOKS: tuple[str, ...] = ("none", "hang", "crash_rank", "oom", "oom_all",
                                 "die", "oom_coexist")


@dataclass(frozen=True)
class RunConfig:
    """How a trial runs (the ``run`` object of a trial spec)."""

    warmup_steps: int = defaults.WARMUP_STEPS
    """Optimizer steps run before timing starts (compilation, allocator warm-up)."""
    measure_steps: int = defaults.MEASURE_STEPS
    """Timed optimizer steps; the result reports their median and spread. With
    ``measure_precision`` set: the fewest timed steps."""
    measure_precision: float | None = defaults.MEASURE_PRECISION
    """Measure until the median step time is known to this relative precision (half-width
    of its distribution-free confidence interval over the median,
    :func:`autotune.trial.measurement.relative_precision`) or ``max_measure_steps`` is reached;
    ``None``: exactly ``measure_steps`` steps."""
    max_measure_steps: int | None = None
    """The most timed steps with ``measure_precision`` (``None``: the larger of
    :data:`~autotune.config.run_defaults.MAX_MEASURE_STEPS` and ``measure_steps``)."""
    confidence: float = defaults.CONFIDENCE
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
    device: str = defaults.DEVICE
    """``auto`` picks xpu, then cuda, then cpu."""
    data: str = "synthetic"
    """``synthetic`` (deterministic random tokens) or ``file`` (a Megatron-style .bin)."""
    data_path: str | None = None
    """Token file for ``data: file``."""
    data_dtype: str = "uint16"
    """Token width of the data file: ``uint16`` or ``uint32``."""
    collective_timeout_s: int = defaults.COLLECTIVE_TIMEOUT_S
    """Process-group timeout, so that a dead rank cannot block the others forever."""
    test_hook: str = "none"
    """Failure injection for tests: ``hang``, ``crash_rank``, ``oom`` (rank 0), ``oom_all``
    (every rank: the launch goes on with its next trial), ``die`` (rank 0's
    process exits at once, as a segfault would end it) -- never in studies."""

    @property
    def step_cap(self) -> int:
        """The most timed steps this run may take."""
        return defaults.step_cap(self.measure_steps, self.measure_precision,
                                 self.max_measure_steps)

    def __post_init__(self) -> None:
        check_int("run.warmup_steps", self.warmup_steps, minimum=0)
        check_int("run.measure_steps", self.measure_steps, minimum=1)
        if self.measure_precision is not None:
            check_float("run.measure_precision", self.measure_precision, strict=True,
                        maximum=1.0)
        if self.max_measure_steps is not None:
            check_int("run.max_measure_steps", self.max_measure_steps,
                      maximum=defaults.MAX_STEPS)
        if not 0.5 <= check_float("run.confidence", self.confidence, maximum=0.9999):
            raise SpecError("run.confidence", self.confidence, "allowed: 0.5 to 0.9999")
        if self.early_stop_tolerance is not None:
            check_float("run.early_stop_tolerance", self.early_stop_tolerance, maximum=0.99)
        if self.best_model_tflops_per_device is not None:
            check_float("run.best_model_tflops_per_device", self.best_model_tflops_per_device,
                        strict=True)
        check_choice("run.dtype", self.dtype, DTYPES)
        check_int("run.seed", self.seed, minimum=0)
        check_choice("run.device", self.device, defaults.DEVICES)
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
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise SpecError("spec", str(path), f"not valid JSON ({err})") from None
        except RecursionError:  # as read_result: a file nested past the parser's stack
            raise SpecError("spec", str(path), "not valid JSON (nested too deeply)") from None
        except OSError as err:  # a directory, a file it may not read: the result says so
            raise SpecError("--spec", str(path), f"cannot read it ({err.strerror})") from None
        return cls.from_dict(raw, source=str(path))
