"""The memory model against the trainer's measured peak (RSS on CPU), in one torchrun launch.

The trainer reports ``ru_maxrss``, the process's lifetime peak, so the trials of the one
launch run in order of increasing predicted peak: each reading is then its own trial's
peak (or, when a trial needs less than the one before, an upper bound we do not test).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.models.memory import estimate_memory

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (REPO / "trainer" / "__main__.py").exists(),
                       reason="trainer/__main__.py is missing: the trainer is not in the tree"),
]

TOLERANCE = 0.25
"""Accepted relative error of the predicted peak against the measured peak RSS."""

# ~33M parameters: model states (16 bytes/param in fp32) dominate the runtime constant.
MODEL = ModelConfig(n_layer=6, hidden=512, n_head=8, seq_len=128, vocab_size=8192,
                    name="mem-check")
LAYOUTS = {
    "tp2": Layout(tp=2, pp=1, dp=1, micro_batch=4, grad_accum=2),
    "pp2": Layout(tp=1, pp=2, dp=1, micro_batch=4, grad_accum=2),
    "dp2_z1": Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=2, zero_stage=1),
    "dp2_z0": Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=2, zero_stage=0),
    "dp2_z0_mb8": Layout(tp=1, pp=1, dp=2, micro_batch=8, grad_accum=1, zero_stage=0),
}


def _spec(layout: Layout) -> dict:
    return {"model": MODEL.to_dict(), "layout": layout.to_dict(),
            "run": {"warmup_steps": 1, "measure_steps": 1, "measure_precision": None,
                    "dtype": "fp32", "seed": 1,
                    "device": "cpu"}}


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, int]]:
    from tests.trainer.trainer_launch import launch

    if shutil.which("torchrun") is None and not (REPO / ".venv").exists():
        pytest.skip("torchrun is not available")
    predicted = {k: estimate_memory(MODEL, lay, dtype="fp32", device="cpu").peak_bytes
                 for k, lay in LAYOUTS.items()}
    order = sorted(LAYOUTS, key=lambda k: predicted[k])
    tmp = tmp_path_factory.mktemp("memory")
    code, results = launch(tmp, 2, {k: _spec(LAYOUTS[k]) for k in order}, timeout_s=600)
    assert code == 0, {k: r.get("error") for k, r in results.items()}
    out, running_max = {}, 0
    for k in order:
        peak = int(results[k]["peak_memory_bytes"])
        if peak > running_max:  # a reading of this trial's own peak
            out[k] = (predicted[k], peak)
        running_max = max(running_max, peak)
    return out


def test_predicted_peak_within_tolerance(measured: dict[str, tuple[int, int]]) -> None:
    assert measured, "no trial raised the process peak"
    errors = {k: (p - m) / m for k, (p, m) in measured.items()}
    for k, (p, m) in measured.items():
        print(f"{k:12s} predicted {p / 2**20:8.1f} MiB  measured {m / 2**20:8.1f} MiB  "
              f"error {errors[k]:+.1%}")
    assert all(abs(e) <= TOLERANCE for e in errors.values()), errors


# Long sequences on a narrow model: with explicit attention the stored score matrices
# (5 a s^2 b / t bytes per layer in 16-bit, Korthikanti et al. 2022) are most of the peak.
SCORES = ModelConfig(n_layer=4, hidden=128, n_head=8, seq_len=768, vocab_size=256,
                     name="mem-scores")
SCORES_LAYOUT = Layout(tp=2, pp=1, dp=1, micro_batch=4, grad_accum=1, recompute="none")


@pytest.fixture(scope="module")
def scores_measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, int]]:
    """Predicted and measured peaks of the same layout with flash, then explicit, attention
    (one launch, in increasing predicted peak: each reading is its own trial's peak)."""
    from tests.trainer.trainer_launch import launch

    models = {a: replace(SCORES, attention=a) for a in ("flash", "explicit")}
    specs = {a: {**_spec(SCORES_LAYOUT), "model": m.to_dict()} for a, m in models.items()}
    code, results = launch(tmp_path_factory.mktemp("scores"), 2, specs, timeout_s=600)
    assert code == 0, {k: r.get("error") for k, r in results.items()}
    return {a: (estimate_memory(m, SCORES_LAYOUT, dtype="fp32", device="cpu").peak_bytes,
                int(results[a]["peak_memory_bytes"])) for a, m in models.items()}


def test_the_explicit_score_term_matches_what_the_trainer_stores(
        scores_measured: dict[str, tuple[int, int]]) -> None:
    (pf, mf), (pe, me) = scores_measured["flash"], scores_measured["explicit"]
    print(f"flash    predicted {pf / 2**20:7.1f} MiB  measured {mf / 2**20:7.1f} MiB")
    print(f"explicit predicted {pe / 2**20:7.1f} MiB  measured {me / 2**20:7.1f} MiB")
    assert me > mf, "the explicit run must have raised the process peak"
    assert abs(pe - me) / me <= TOLERANCE
    # The difference isolates the score matrices: the term itself, within the tolerance.
    assert abs((pe - pf) - (me - mf)) / (me - mf) <= TOLERANCE
