"""The memory model's prediction of a layout is computed once per process and shared by
every judging of it (`autotune/feasibility/memory_terms.py`): `plan` judges a study's
space uncalibrated and calibrated, a worker after every trial. The memo must change no
verdict: the same prediction whatever the correction, a separate entry for every input the
prediction depends on, and no memo where measured layer bytes take part."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.config.model import MODEL_PRESETS
from autotune.feasibility import MemoryBudget
from autotune.feasibility import memory_terms as terms
from autotune.layout import Layout
from autotune.models.memory import estimate_memory
from autotune.models.memory_uncertainty import estimate_uncertainty
from autotune.models.profile import LayerProfile

MODEL = MODEL_PRESETS["gpt-1.3b"]
LAYOUT = Layout(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=4, zero_stage=1,
                recompute="selective", sequence_parallel=True)
BUDGET = MemoryBudget(capacity_bytes=40 * 2**30, margin=0.05, dtype="bf16",
                      device="a100-40gb")


@pytest.fixture(autouse=True)
def empty_memo() -> None:
    terms._cached.cache_clear()


def test_the_prediction_is_the_models_and_computed_once() -> None:
    first = BUDGET.verdict(MODEL, LAYOUT)
    est = estimate_memory(MODEL, LAYOUT, dtype="bf16", device="a100-40gb")
    unc = estimate_uncertainty(MODEL, LAYOUT, est, dtype="bf16", device="a100-40gb")
    assert terms.stack_memory_terms(MODEL, LAYOUT, dtype="bf16", device="a100-40gb",
                                    profile=None, stack="deepspeed",
                                    grad_accum_dtype=None) == ((est, unc),)
    # A calibrated budget (what `plan` judges with after the uncalibrated pass) reuses
    # the prediction and applies its correction to it.
    calibrated = replace(BUDGET, correction=1.3, correction_sigma=0.1)
    second = calibrated.verdict(MODEL, LAYOUT)
    info = terms._cached.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    assert second.predicted_bytes == first.predicted_bytes == est.peak_bytes
    assert second.corrected_bytes == int(1.3 * est.peak_bytes)
    assert second.p_fit < first.p_fit


@pytest.mark.parametrize(("change", "moves"), [
    ({"dtype": "fp32"}, True), ({"stack": "megatron"}, True),
    ({"stack": "megatron-deepspeed-either"}, True), ({"device": "a100-80gb"}, False),
    ({"grad_accum_dtype": "bf16"}, True), ({"grad_accum_dtype": "fp32"}, False)])
def test_each_input_of_the_prediction_has_its_own_entry(change: dict[str, str],
                                                        moves: bool) -> None:
    """``moves``: whether this layout's predicted peak depends on the change (ZeRO-1's
    gradients are fp32-accumulated by default, and the device sets no term here): the
    memo keeps an entry per input either way."""
    base = BUDGET.verdict(MODEL, LAYOUT)
    other = replace(BUDGET, **change)
    changed = other.verdict(MODEL, LAYOUT)
    assert terms._cached.cache_info().misses == 2
    direct = terms._unprofiled(MODEL, LAYOUT, other.dtype, other.device, other.stack,
                               other.grad_accum_dtype)
    assert changed.predicted_bytes == direct[0][0].peak_bytes
    assert (changed.predicted_bytes != base.predicted_bytes) is moves
    assert len(direct) == (2 if change.get("stack") == "megatron-deepspeed-either" else 1)


def test_a_profiled_prediction_is_computed_without_the_memo() -> None:
    """Measured layer bytes (a study's ``cluster.profile``): hashing the profile's entries
    on every call would cost more than the memo saves, so each call computes."""
    calls = []
    real = terms._terms

    def spy(*args: object) -> terms.Terms:
        calls.append(args)
        return real(*args)  # type: ignore[arg-type]

    profile = LayerProfile(source="test")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(terms, "_terms", spy)
        verdicts = [replace(BUDGET, profile=profile).verdict(MODEL, LAYOUT) for _ in range(2)]
    assert [c[4] for c in calls] == [profile, profile]  # computed each time, with it
    assert terms._cached.cache_info().currsize == 0
    assert verdicts[0] == verdicts[1]
