"""The runner's side of issue #16: batches of layouts per launch, the ``stopped`` outcome,
the study file's measurement settings."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.study import TrialConfig
from autotune.errors import SpecError
from autotune.storage.values import measured_value
from autotune.trial import LaunchReport, RunConfig, TrialResult
from autotune.trial.classify import classify
from tests.helpers import run_cli, write_study


def _result(**kw: object) -> TrialResult:
    return TrialResult(status="ok", model_tflops_per_device=0.5, step_time_s=0.2, **kw)


def test_an_early_stopped_result_is_stopped_and_measured() -> None:
    outcome = classify(LaunchReport(result=_result(early_stopped=True,
                                                   early_stop_reason="hopeless: x"),
                                    returncode=0))
    assert outcome.kind == "stopped" and outcome.value == 0.5
    # Optuna's state for a trial cut short; the strategy still learns its (low) value.
    assert outcome.state == TrialState.PRUNED and outcome.kind.observed == "ok"
    assert not outcome.retry and not outcome.infeasible
    assert classify(LaunchReport(result=_result(), returncode=0)).kind == "complete"


@pytest.mark.parametrize("trial, field", [
    ({"early_stop_tolerance": 0.1, "measure_precision": None}, "trial.early_stop_tolerance"),
    ({"measure_precision": 0.0}, "trial.measure_precision"),
    ({"max_measure_steps": 2, "measure_steps": 3}, "trial.max_measure_steps"),
    ({"batch_size": 0}, "trial.batch_size"),
    ({"early_stop_tolerance": 1.5}, "trial.early_stop_tolerance"),
])
def test_bad_measurement_settings_name_the_field(trial: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        TrialConfig.from_dict(trial)
    assert err.value.field == field


def test_the_step_cap() -> None:
    assert RunConfig(measure_steps=3, measure_precision=None).step_cap == 3
    assert RunConfig(measure_steps=3, measure_precision=0.05).step_cap == 12
    assert RunConfig(measure_steps=3, measure_precision=0.05, max_measure_steps=7).step_cap == 7


@pytest.mark.slow
def test_a_study_in_batches_keeps_its_budget_and_tells_each_layout(tmp_path: Path) -> None:
    """4 trials in batches of 3: two launches, exactly 4 distinct layouts measured and
    claimed, each told with its own result and time breakdown."""
    db = tmp_path / "b.db"
    study = write_study(tmp_path / "study.yaml", name="batches", db=db, n_trials=4,
                        trial={"warmup_steps": 1, "measure_steps": 2, "timeout_s": 120,
                               "device": "cpu", "batch_size": 3,
                               "early_stop_tolerance": 0.3})
    done = run_cli("run", str(study))
    assert done.returncode == 0, done.stderr
    trials = optuna.load_study(study_name="batches", storage=f"sqlite:///{db}").get_trials()
    measured = [t for t in trials if measured_value(t) is not None]  # complete or stopped
    assert len(measured) == 4 and len({t.user_attrs["layout"] for t in measured}) == 4
    batches = sorted((t.user_attrs["batch"]["lead"], t.user_attrs["batch"]["index"])
                     for t in measured)
    assert len({lead for lead, _ in batches}) == 2  # launches of 3 and 1
    assert [i for _, i in batches] == [0, 1, 2, 0]
    for t in measured:
        assert t.user_attrs["outcome"] in ("complete", "stopped")
        assert t.user_attrs["timings_s"]["measure"] > 0
        assert t.user_attrs["measured_steps"] >= 2
    status = run_cli("status", str(study))
    assert status.returncode == 0, status.stderr
    assert "batches: time: 4 trials in 2 launches" in status.stdout


def test_the_strategy_sees_a_stopped_trial_as_measured_low() -> None:
    from autotune.layout import Layout
    from autotune.runner.optuna_io import observations

    study = optuna.create_study(direction="maximize")
    lay = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=2)
    trial = study.ask()
    trial.set_user_attr("layout", lay.key())
    trial.set_user_attr("layout_dict", lay.to_dict())
    trial.set_user_attr("outcome", "stopped")
    study.tell(trial, 0.25)
    [seen] = observations(study.get_trials(), {})
    assert seen.status == "ok" and seen.value == 0.25 and seen.layout == lay
