"""The memory model's prediction and error bar of one layout, per training stack, computed
once per process: what :meth:`autotune.feasibility.MemoryBudget.verdict` corrects and
weighs.

A study's space is judged more than once with the same model and budget, only the
calibration's correction differing: ``plan`` ranks it once uncalibrated (the memory
model's typical error, :func:`autotune.runner.learning.memory_log_sd`) and once
calibrated; a run's worker re-ranks it after every trial. The prediction does not depend
on the correction, so it is memoised here (a pure function of hashable arguments, like
:func:`autotune.models.network.place_group`), and each judging pays only for the
probability (a study without measured layer bytes: :func:`stack_memory_terms`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.config.model import ModelConfig
    from autotune.layout import Layout
    from autotune.models.memory import MemoryEstimate
    from autotune.models.memory_uncertainty import MemoryUncertainty
    from autotune.models.profile import LayerProfile

__all__ = ["stack_memory_terms"]

Terms = tuple[tuple["MemoryEstimate", "MemoryUncertainty"], ...]


def stack_memory_terms(model: ModelConfig, layout: Layout, *, dtype: str, device: str | None,
                       profile: LayerProfile | None, stack: str,
                       grad_accum_dtype: str | None) -> Terms:
    """``(estimate, uncertainty)`` of ``layout`` for each stack ``stack`` may be
    (:func:`autotune.models.stacks.memory_stacks`: one, or the two of
    ``megatron-deepspeed-either``), the first the larger states'. With measured layer
    bytes (``profile``) not memoised: a frozen dataclass hashes all its entries on every
    call, which would cost a large profile more than the memo saves."""
    if profile is not None:
        return _terms(model, layout, dtype, device, profile, stack, grad_accum_dtype)
    return _cached(model, layout, dtype, device, stack, grad_accum_dtype)


def _terms(model: ModelConfig, layout: Layout, dtype: str, device: str | None,
           profile: LayerProfile | None, stack: str, grad_accum_dtype: str | None) -> Terms:
    from autotune.models.memory import estimate_memory  # local: keeps the trainer light
    from autotune.models.memory_uncertainty import estimate_uncertainty
    from autotune.models.stacks import memory_stacks

    each = []
    for one_stack in memory_stacks(stack):
        one = estimate_memory(model, layout, dtype=dtype, device=device, profile=profile,
                              stack=one_stack, grad_accum_dtype=grad_accum_dtype)
        each.append((one, estimate_uncertainty(model, layout, one, dtype=dtype,
                                               device=device, stack=one_stack)))
    return tuple(each)


def _unprofiled(model: ModelConfig, layout: Layout, dtype: str, device: str | None,
                stack: str, grad_accum_dtype: str | None) -> Terms:
    return _terms(model, layout, dtype, device, None, stack, grad_accum_dtype)


# Bounded: ~2 KB an entry; the 175B study judges 1,386 structurally valid layouts of its
# 4,950 (the others fail before the memory rule), so a study's space fits several times.
_cached = functools.lru_cache(maxsize=8192)(_unprofiled)
