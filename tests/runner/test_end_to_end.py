"""`autotune run` end to end with real trainer subprocesses on CPU: run, resume, export."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from tests.helpers import run_cli, write_study

pytestmark = pytest.mark.slow


def _trials(db: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{db}").get_trials()


def test_run_resume_and_export(tmp_path: Path) -> None:
    db = tmp_path / "e2e.db"
    study = write_study(tmp_path / "study.yaml", name="e2e", db=db, n_trials=2)

    first = run_cli("run", str(study))
    assert first.returncode == 0, first.stderr
    assert "best layout:" in first.stdout
    assert "[2/2]" in first.stderr  # progress lines: trial n of N
    done = [t for t in _trials(db, "e2e") if t.state == TrialState.COMPLETE]
    assert len(done) == 2

    # Resume: asking for 3 in total runs exactly one more, measuring nothing twice.
    second = run_cli("run", str(study), "--n-trials", "3")
    assert second.returncode == 0, second.stderr
    trials = _trials(db, "e2e")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 3
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    keys = [t.user_attrs["layout"] for t in complete]
    assert len(set(keys)) == 3
    for t in complete:
        assert t.value is not None and t.value > 0
        assert t.user_attrs["outcome"] == "complete"
        assert t.user_attrs["model_tflops_per_device"] == pytest.approx(t.value)

    # The measurements table holds one row per execution, matching the trials.
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        rows = conn.execute(text(
            "select trial_number, layout_key, outcome, model_tflops_per_device, device_type,"
            " world_size from measurements where study_name = 'e2e'")).all()
    assert len(rows) == 3
    by_number = {t.number: t for t in complete}
    for number, key, outcome, value, device, world in rows:
        assert outcome == "complete" and device == "cpu" and world == 2
        assert by_number[number].user_attrs["layout"] == key
        assert value == pytest.approx(by_number[number].value)

    status = run_cli("status", str(study))
    assert status.returncode == 0 and "e2e" in status.stdout

    best_json = run_cli("best", str(study), "--emit", "json")
    assert best_json.returncode == 0, best_json.stderr
    best = json.loads(best_json.stdout)
    assert best["model_tflops_per_device"] == pytest.approx(max(t.value for t in complete))

    out = tmp_path / "export"
    out.mkdir()
    emitted = run_cli("best", str(study), "--emit", "deepspeed", "--out", str(out))
    assert emitted.returncode == 0, emitted.stderr
    assert "deepspeed" in emitted.stdout and "--tensor-model-parallel-size" in emitted.stdout
    _assert_deepspeed_accepts(out / "ds_config.json", dp=best["layout"]["dp"])


def _assert_deepspeed_accepts(path: Path, dp: int) -> None:
    """DeepSpeed's own config parser accepts the file (batch arithmetic included)."""
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    # No process group in this test process: DeepSpeed would fall back to world size 1
    # when asking for the rank; with a rank, it takes the data-parallel size from the mpu.
    pytest.MonkeyPatch().setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)

    class _Mpu:  # DeepSpeed asks the model-parallel unit for the data-parallel size
        def get_data_parallel_world_size(self) -> int:
            return dp

        def get_model_parallel_world_size(self) -> int:
            return 1

    config = DeepSpeedConfig(str(path), mpu=_Mpu())
    data = json.loads(path.read_text())
    assert config.train_batch_size == data["train_batch_size"]
    assert config.zero_optimization_stage == data["zero_optimization"]["stage"]
