"""The calibration maths (issue #13, part 2): the memory correction's grid posterior with
censored OOMs, the throughput correction, the carry-over between studies, and what the
corrections do to the memory verdict."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.feasibility import Constraints
from autotune.layout import Layout
from autotune.models.calibration import (
    STAGE_CORRELATION,
    STUDY_CORRELATION,
    THROUGHPUT_NOISE_SD,
    THROUGHPUT_PRIOR_SD,
    CalibrationKey,
    LogCorrection,
    MeasuredRow,
    MemoryPoint,
    calibrate,
    carry_over,
    comparable_peak_bytes,
    fit_memory,
    fit_throughput,
)
from autotune.models.memory import runtime_bytes
from autotune.models.prediction_spread import scale_sd

SD = 0.12  # a typical stated log-sd of the memory model
LAY = Layout(tp=1, pp=1, dp=8, micro_batch=2, grad_accum=4, zero_stage=2)


def ok(ratio: float, predicted: float = 1e9) -> MemoryPoint:
    return MemoryPoint(predicted, measured_bytes=predicted * ratio)


def oom(usable_over_predicted: float, predicted: float = 1e9) -> MemoryPoint:
    return MemoryPoint(predicted, exceeded_bytes=predicted * usable_over_predicted)


def test_the_prior_dominates_without_data() -> None:
    assert fit_memory([], prior_mean=0.05, prior_sd=SD, noise_sd=SD) == LogCorrection(0.05, SD)
    assert fit_throughput([]) == LogCorrection(0.0, THROUGHPUT_PRIOR_SD)
    cal = calibrate(CalibrationKey("a100-80gb", "bf16"), [], [], memory_sd=SD,
                    usable_bytes=7e10)
    # Nothing measured: no correction, and no extra spread beyond the model's own.
    assert (cal.memory_factor, cal.memory_sd, cal.throughput_factor) == (1.0, 0.0, 1.0)
    # One point against a prior much tighter than its noise moves the correction little.
    assert abs(fit_memory([ok(0.5)], prior_sd=0.01, noise_sd=SD).mean) < 0.01


def test_ok_points_pull_the_correction_to_their_mean() -> None:
    r = math.log(0.8)
    for n in (1, 4, 50):
        fit = fit_memory([ok(0.8)] * n, prior_sd=SD, noise_sd=SD)
        # Conjugate normal: the grid must agree with the closed form.
        assert fit.mean == pytest.approx(n * r / (n + 1), abs=1e-4)
        assert fit.sd == pytest.approx(SD / math.sqrt(n + 1), rel=1e-3)
        assert (fit.n_ok, fit.n_censored) == (n, 0)
    assert fit_memory([ok(0.8)] * 50, prior_sd=SD, noise_sd=SD).factor == pytest.approx(
        0.8, rel=0.01)
    # Scattered points: their mean, not any one of them.
    mixed = fit_memory([ok(0.7), ok(0.9), ok(0.8)] * 20, prior_sd=SD, noise_sd=SD)
    mean_r = (math.log(0.7) + math.log(0.9) + math.log(0.8)) / 3
    assert mixed.mean == pytest.approx(60 * mean_r / 61, abs=1e-3)


def test_a_censored_oom_moves_the_correction_up() -> None:
    # Predicted with 20% to spare, yet out of memory: the peak was > 1.2x the prediction.
    one = fit_memory([oom(1.2)], prior_sd=SD, noise_sd=SD)
    assert one.mean > 0.1 and one.n_censored == 1
    two = fit_memory([oom(1.2), oom(1.3)], prior_sd=SD, noise_sd=SD)
    assert two.mean > one.mean
    # An OOM the model expected (usable below the prediction) says almost nothing.
    expected = fit_memory([oom(0.7)], prior_sd=SD, noise_sd=SD)
    assert 0 < expected.mean < 0.01
    # The closed form of one censored point (a skew-normal's mean) agrees with the grid:
    # E[u] = s0^2 / sqrt(s0^2 + t^2) * phi(c) / Phi(c), c = -b / sqrt(s0^2 + t^2).
    b, s = math.log(1.2), math.hypot(SD, SD)
    c = -b / s
    pdf, cdf = math.exp(-c * c / 2) / math.sqrt(2 * math.pi), 0.5 * math.erfc(-c / math.sqrt(2))
    assert one.mean == pytest.approx(SD**2 / s * pdf / cdf, abs=1e-4)
    # Beside measured peaks an OOM still pushes up, and is a bound, not a point.
    with_ok = fit_memory([ok(1.0)] * 5 + [oom(1.15)], prior_sd=SD, noise_sd=SD)
    assert 0 < with_ok.mean < math.log(1.15)


def test_throughput_is_conjugate_normal() -> None:
    ys = [math.log(0.5)] * 3
    fit = fit_throughput(ys)
    precision = 1 / THROUGHPUT_PRIOR_SD**2 + 3 / THROUGHPUT_NOISE_SD**2
    assert fit.mean == pytest.approx(3 * math.log(0.5) / THROUGHPUT_NOISE_SD**2 / precision)
    assert fit.sd == pytest.approx(precision ** -0.5) and fit.n_ok == 3


def test_carry_over_shrinks_towards_the_fresh_prior_and_never_widens_it() -> None:
    assert carry_over(LogCorrection(), 0.3) == (0.0, 0.3)  # nothing learned: fresh
    mean, sd = carry_over(LogCorrection(-0.4, 0.0, n_ok=100), 0.3)
    assert mean == pytest.approx(STUDY_CORRELATION * -0.4)
    assert sd == pytest.approx(0.3 * math.sqrt(1 - STUDY_CORRELATION**2))
    # A correction the earlier studies barely knew stays at the fresh prior's width.
    assert carry_over(LogCorrection(0.0, 0.3, n_ok=1), 0.3)[1] == pytest.approx(0.3)


def test_peaks_are_compared_in_the_models_terms() -> None:
    assert comparable_peak_bytes(1e9, "cpu") == 1e9  # the peak RSS holds the runtime
    assert comparable_peak_bytes(1e9, "h100") == 1e9 + runtime_bytes("h100")


def _row(study: str, *, peak_ratio: float | None = None, oom: bool = False,
         tflops_ratio: float | None = None, zero_stage: int = 2) -> MeasuredRow:
    return MeasuredRow(study, replace(LAY, zero_stage=zero_stage), oom,
                       predicted_memory_bytes=4e9,
                       peak_memory_bytes=None if peak_ratio is None else 4e9 * peak_ratio,
                       predicted_tflops=100.0,
                       measured_tflops=None if tflops_ratio is None else 100.0 * tflops_ratio)


def test_calibrate_warm_starts_from_earlier_studies_and_refits_on_its_own() -> None:
    key = CalibrationKey("cpu", "fp32")
    prior_sd = scale_sd("cpu")  # the search's prior on the device: no validation covers it
    earlier = ([_row("a", peak_ratio=0.8, tflops_ratio=0.5)] * 6
               + [_row("b", peak_ratio=0.8, tflops_ratio=0.5)] * 4)
    warm = calibrate(key, earlier, [], memory_sd=SD, usable_bytes=8e9)
    assert warm.learned_from == (("a", 6), ("b", 4)) and warm.own == 0
    assert 0.8 < warm.memory_factor < 0.85
    # Ten residuals of ln 0.5 under the conjugate prior, shrunk towards 1 by the prior's
    # width, then carried over at STUDY_CORRELATION (its mean times rho).
    precision = 1 / prior_sd**2 + 10 / THROUGHPUT_NOISE_SD**2
    learned = 10 * math.log(0.5) / THROUGHPUT_NOISE_SD**2 / precision
    assert warm.throughput_factor == pytest.approx(math.exp(STUDY_CORRELATION * learned))
    assert 0.5 < warm.throughput_factor < 0.6
    assert len(warm.residuals) == 10
    assert warm.residuals[0].log_prediction == pytest.approx(0.0, abs=1e-12)
    # The study's own trials then disagree: they win, from the carried-over prior.
    own = [_row("me", peak_ratio=1.0, tflops_ratio=1.0)] * 8
    refit = calibrate(key, earlier, own, memory_sd=SD, usable_bytes=8e9)
    assert refit.own == 8 and refit.memory.n_ok == 18
    assert warm.memory_factor < refit.memory_factor < 1.0
    carried_var = (STUDY_CORRELATION**2 / precision
                   + (1 - STUDY_CORRELATION**2) * prior_sd**2)
    own_precision = 1 / carried_var + 8 / THROUGHPUT_NOISE_SD**2
    expected = STUDY_CORRELATION * learned / carried_var / own_precision
    assert refit.throughput_factor == pytest.approx(math.exp(expected))
    assert warm.throughput_factor < refit.throughput_factor < 1.0
    # An OOM row is a bound at the usable memory; without a memory rule it is left out.
    ooms = [_row("me", oom=True)]
    assert calibrate(key, [], ooms, memory_sd=SD, usable_bytes=4.4e9).memory.n_censored == 1
    assert calibrate(key, [], ooms, memory_sd=SD, usable_bytes=None).memory.n == 0


def test_the_memory_correction_changes_p_fit_and_the_verdict_of_untried_layouts() -> None:
    model = MODEL_PRESETS["gpt-1.3b"]
    cons = Constraints.from_configs(ClusterConfig(nodes=1, devices_per_node=8,
                                                  device="a100-40gb"),
                                    TrainingConfig(global_batch=64), SearchConfig(),
                                    TrialConfig())
    assert cons.memory is not None
    probe = Layout(tp=1, pp=1, dp=8, micro_batch=8, grad_accum=1, zero_stage=2)
    before = cons.memory_verdict(probe, model)
    assert before is not None
    # A sibling predicted with ~60% to spare ran out of memory.
    lighter = Layout(tp=1, pp=1, dp=8, micro_batch=2, grad_accum=4, zero_stage=2)
    light = cons.memory_verdict(lighter, model)
    assert light is not None and light.verdict.value == "fits"
    fit = fit_memory([MemoryPoint(light.predicted_bytes, exceeded_bytes=light.usable_bytes)],
                     prior_sd=SD, noise_sd=SD)
    after = cons.with_memory_correction(fit.factor, fit.sd).memory_verdict(probe, model)
    assert after is not None
    assert after.p_fit < before.p_fit and after.verdict.value == "exceeds"
    assert after.predicted_bytes == before.predicted_bytes  # the model's own figure stays
    # Measured peaks below the prediction raise the probability instead.
    low = fit_memory([ok(0.8)] * 3, prior_sd=SD, noise_sd=SD)
    relaxed = replace(cons.memory, correction=low.factor, correction_sigma=low.sd)
    assert relaxed.verdict(model, probe).p_fit > before.p_fit


def test_each_zero_stage_has_its_own_memory_correction() -> None:
    # ZeRO-0 measured at 0.78 of its prediction, ZeRO-1 as predicted (the CPU study's
    # pattern): each stage follows its own points, and the study's stage 2 has none.
    key = CalibrationKey("cpu", "fp32")
    own = ([_row("me", peak_ratio=0.78, zero_stage=0)] * 6
           + [_row("me", peak_ratio=1.0, zero_stage=1)] * 6)
    cal = calibrate(key, [], own, memory_sd=SD, usable_bytes=8e9, zero_stages=(0, 1, 2))
    by = dict(cal.memory_by_stage)
    assert set(by) == {0, 1, 2}
    assert by[0].factor == pytest.approx(0.78, rel=0.05) and by[0].n_ok == 6
    assert by[1].factor == pytest.approx(1.0, abs=0.04) and by[1].n_ok == 6
    # Stage 2: half of what the other stages share (their pooled correction), wider.
    assert by[2].n == 0 and by[2].mean == pytest.approx(
        STAGE_CORRELATION * cal.memory.mean, abs=0.02)
    assert by[2].sd > max(by[0].sd, by[1].sd)
    stages = {z: (f, sd) for z, f, sd in cal.memory_stage_corrections()}
    assert stages[0][0] == pytest.approx(by[0].factor)
    # An OOM on one stage moves the others, less than its own.
    oomed = calibrate(key, [], [_row("me", oom=True, zero_stage=1)], memory_sd=SD,
                      usable_bytes=4.4e9, zero_stages=(0, 1))
    moved = dict(oomed.memory_by_stage)
    assert moved[1].mean > moved[0].mean > 0
