"""The one set of defaults of how a trial runs, read by the study file's ``trial`` section
(:class:`autotune.config.study.TrialConfig`) and by the trial spec's ``run`` object
(:class:`autotune.trial.spec.RunConfig`), so that a hand-written spec and a study's trial
measure alike (two copies of the defaults drift apart: ``max_measure_steps`` and
``measure_precision`` did)."""

from __future__ import annotations

__all__ = ["WARMUP_STEPS", "MEASURE_STEPS", "MEASURE_PRECISION", "MAX_MEASURE_STEPS",
           "MAX_STEPS", "PRECISION", "CONFIDENCE", "COLLECTIVE_TIMEOUT_S", "DEVICE", "DEVICES",
           "step_cap"]

WARMUP_STEPS = 1
"""Untimed optimizer steps (compilation, allocator warm-up)."""
MEASURE_STEPS = 3
"""Timed optimizer steps; with a precision, the fewest."""
PRECISION = 0.05
"""The relative precision a trial's median step time is measured to by default; also what
the confirmation round assumes of a trial measured without one."""
MEASURE_PRECISION: float | None = PRECISION
"""Relative precision the median step time is measured to (``None``: exactly
``MEASURE_STEPS`` steps)."""
MAX_MEASURE_STEPS = 12
"""The step cap with a precision when none is set (and ``measure_steps`` is smaller)."""
MAX_STEPS = 100_000
"""Most warm-up or measured steps of one trial."""
CONFIDENCE = 0.95
"""Confidence of the precision's interval and of the early stop's bound."""
COLLECTIVE_TIMEOUT_S = 300
"""Process-group timeout inside a trial, so that a dead rank cannot block the others."""
DEVICE = "auto"
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "xpu")
"""``auto`` picks xpu, then cuda, then cpu."""


def step_cap(measure_steps: int, measure_precision: float | None,
             max_measure_steps: int | None) -> int:
    """The most timed steps a trial takes: ``measure_steps`` without a precision, else
    ``max_measure_steps`` (unset: the larger of :data:`MAX_MEASURE_STEPS` and
    ``measure_steps``), never fewer than ``measure_steps``."""
    if measure_precision is None:
        return measure_steps
    return max(measure_steps, max_measure_steps or MAX_MEASURE_STEPS)
