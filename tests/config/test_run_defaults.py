"""One set of defaults for how a trial runs (autotune/config/run_defaults.py, issue #20): the
study file's ``trial`` section and a trial spec's ``run`` object agree, so a hand-written
spec measures as a study's trial does."""

from __future__ import annotations

from pathlib import Path

from autotune.config import run_defaults
from autotune.config.study import TrialConfig
from autotune.spec import load_study
from autotune.trial import RunConfig
from tests.helpers import write_study

SHARED = ("warmup_steps", "measure_steps", "measure_precision", "max_measure_steps", "device",
          "collective_timeout_s")


def test_the_study_file_and_the_trial_spec_share_their_defaults() -> None:
    trial, run = TrialConfig(), RunConfig()
    assert {k: getattr(trial, k) for k in SHARED} == {k: getattr(run, k) for k in SHARED}
    assert run.confidence == run_defaults.CONFIDENCE


def test_the_step_cap_is_one_rule(tmp_path: Path) -> None:
    """Unset ``max_measure_steps``: the larger of 12 and ``measure_steps``, in the spec the
    study sends and in a bare spec alike (the spec said 4 x ``measure_steps`` before)."""
    assert RunConfig(measure_steps=3).step_cap == run_defaults.MAX_MEASURE_STEPS == 12
    assert RunConfig(measure_steps=20).step_cap == 20
    assert RunConfig(measure_steps=3, measure_precision=None).step_cap == 3
    for steps in (3, 20):
        spec = load_study(write_study(tmp_path / f"s{steps}.yaml",
                                      trial={"measure_steps": steps, "device": "cpu"}))
        assert spec.run_config().step_cap == RunConfig(measure_steps=steps).step_cap
