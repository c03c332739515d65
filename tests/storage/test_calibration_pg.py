"""The cross-study warm start on a real PostgreSQL (issue #13, part 2): a first real CPU
study of the tiny model fills the ``measurements`` table; a second study of the same device
then predicts memory and step time differently from a fresh one (``--no-learn``), closer
to what it goes on to measure, and says what it learned from (``plan``, ``status``).

Real trainer runs (torchrun, DeepSpeed, gloo; ~10 s each): run under the shared lock,
``flock /tmp/autotune-heavy.lock python -m pytest -m postgres ...``. The test works in a
database of its own on the server (created and dropped here): schema v2 migrates any
database it opens, and the shared ``test`` database serves branches still at v1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from autotune.storage.keys import StudyAttr, TrialAttr
from tests.helpers import run_cli, write_study
from tests.replay_study import own_pg_database
from tests.runner.test_calibration_cpu import TINY_STUDY

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

STEP_TIME_NOISE = 0.4
"""Relative error one CPU trial's step time can carry on a loaded 2-core machine."""


@pytest.fixture
def own_database(pg_url: str) -> Iterator[str]:
    """A fresh database on the PostgreSQL server, dropped afterwards."""
    with own_pg_database(pg_url, prefix="autotune_calib") as url:
        yield url


def _study(tmp: Path, name: str, url: str, n_trials: int, **search: Any) -> Path:
    return write_study(tmp / f"{name}.yaml", name=name, devices=2, n_trials=n_trials,
                       **{**TINY_STUDY,
                          "search": {**TINY_STUDY["search"], "n_trials": n_trials, **search},
                          "storage": {"url": url, "heartbeat_interval_s": 2,
                                      "grace_period_s": 30}})


def _plan_row(study: Path, *flags: str) -> dict[str, Any]:
    done = run_cli("plan", str(study), "--format", "json", "--top", "1", *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# The warm start's correction comes from the first study's launches, its error from the
# second's: another test's load during one of them and not the other skewed it (46% off
# in a fresh-clone CI in 2 workers, 2026-12-07), as it skews any comparison of launches.
@pytest.mark.alone
def test_a_second_study_on_the_same_device_starts_calibrated(
        tmp_path: Path, own_database: str, unique: str) -> None:
    url = own_database
    first = _study(tmp_path, f"first-{unique}", url, 3)
    done = run_cli("run", str(first), "--quiet", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    # Another study of the tiny model on the same CPUs: another batch, recompute only.
    second = _study(tmp_path, f"second-{unique}", url, 1, recompute=["full"])
    second_text = second.read_text().replace("global_batch: 8", "global_batch: 16")
    second.write_text(second_text)
    fresh, warm = _plan_row(second, "--no-learn"), _plan_row(second)
    assert fresh["calibration"]["studies"] == [] and fresh["calibration"]["own"] == 0
    assert warm["calibration"]["studies"] == [{"study": f"first-{unique}", "measurements": 3}]
    f_row, w_row = fresh["feasible"][0], warm["feasible"][0]
    assert f_row["key"] == w_row["key"]
    # A fresh study predicts with the models alone; the warm one corrects both.
    assert f_row["calibrated_peak_memory_bytes"] == pytest.approx(
        f_row["peak_memory_bytes"], rel=1e-6)
    assert f_row["calibrated_model_tflops_per_device"] == pytest.approx(
        f_row["model_tflops_per_device"])
    assert w_row["calibrated_peak_memory_bytes"] != pytest.approx(
        f_row["calibrated_peak_memory_bytes"], rel=1e-3)
    assert w_row["calibrated_model_tflops_per_device"] != pytest.approx(
        f_row["calibrated_model_tflops_per_device"], rel=1e-3)

    done = run_cli("run", str(second), "--quiet", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    study = optuna.load_study(study_name=f"second-{unique}", storage=url)
    [trial] = study.get_trials(states=(TrialState.COMPLETE,))
    attrs = trial.user_attrs
    measured_mem, measured_tflops = attrs[TrialAttr.PEAK_MEMORY_GIB], attrs[TrialAttr.MODEL_TFLOPS]
    errors = {
        "memory": (abs(attrs[TrialAttr.PREDICTED_MEMORY_GIB] / measured_mem - 1),
                   abs(attrs[TrialAttr.CALIBRATED_MEMORY_GIB] / measured_mem - 1)),
        "step time": (abs(attrs[TrialAttr.PREDICTED_TFLOPS] / measured_tflops - 1),
                      abs(attrs[TrialAttr.CALIBRATED_TFLOPS] / measured_tflops - 1))}
    for what, (raw, cal) in errors.items():
        print(f"second study, first trial {attrs[TrialAttr.LAYOUT]}: {what} error "
              f"{raw:.1%} fresh, {cal:.1%} warm-started")
    # Memory is deterministic to about 1% run to run, so one trial shows the warm start's
    # gain. One trial's step time on a shared 2-core CPU is not: CI measured the fresh
    # model 10.6% off and the warm one 15.5% off on a run where the first study's three
    # steps were themselves that noisy. So step time is held to a bound (the warm start
    # may not push it past 40% off, as a wrong sign or a lost scale would), and its
    # gain is shown over six trials in tests/runner/test_calibration_cpu.py.
    raw, cal = errors["memory"]
    assert cal < raw, "memory"
    raw, cal = errors["step time"]
    assert cal < max(raw, STEP_TIME_NOISE), "step time"
    record = study.user_attrs[StudyAttr.LEARNED_FROM]
    assert record["studies"] == [{"study": f"first-{unique}", "measurements": 3}]
    status = run_cli("status", str(second))
    assert status.returncode == 0, status.stderr
    assert (f"second-{unique}: calibration: learned from 1 earlier study of cpu/fp32/builtin "
            f"(first-{unique}: 3 measurements)") in status.stdout
    with create_engine(url).connect() as conn:  # schema v2, with the workload of each row
        assert set(conn.execute(text("select distinct workload from measurements")).scalars()) \
            == {"builtin"}
