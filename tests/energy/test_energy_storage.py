"""Schema v6: a trial's energy columns, the migration of an older database (its rows: not
measured, NULL), and the "not measured" path of a real CPU trial end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from autotune.config.study import StorageConfig
from autotune.storage.db import Storage
from autotune.storage.schema import ENERGY_COLUMNS, SCHEMA_VERSION
from tests.helpers import REPO
from tests.storage.test_calibration_rows import _row


def test_a_v3_database_gets_the_energy_columns_null_for_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v3.db'}"
    Storage(StorageConfig(url=url)).close()
    engine = create_engine(url)
    with engine.begin() as conn:  # make it what autotune v3 left behind
        for name, _ in ENERGY_COLUMNS:
            conn.execute(text(f"ALTER TABLE measurements DROP COLUMN {name}"))
        conn.execute(text("DELETE FROM autotune_schema"))
        conn.execute(text("INSERT INTO autotune_schema (version) VALUES (3)"))
        cols = _row("old")
        conn.execute(text(f"INSERT INTO measurements ({', '.join(cols)}) VALUES "
                          f"({', '.join(':' + k for k in cols)})"), cols)
    storage = Storage(StorageConfig(url=url))
    storage.add_measurement(_row("new", energy_j_per_step=12.5, energy_source="rapl",
                                 joules_per_token=0.1, model_tflops_per_watt=0.002))
    with engine.connect() as conn:
        rows = conn.execute(text("select study_name, energy_j_per_step, energy_source, "
                                 "joules_per_token from measurements order by id")).all()
        assert [tuple(r) for r in rows] == [("old", None, None, None),
                                           ("new", 12.5, "rapl", 0.1)]
        assert conn.execute(text("select max(version) from autotune_schema")).scalar() \
            == SCHEMA_VERSION == 6
    storage.close()
    Storage(StorageConfig(url=url)).close()  # opening it again changes nothing
    engine.dispose()


@pytest.mark.slow
def test_a_cpu_trial_without_counters_says_not_measured(tmp_path: Path) -> None:
    spec = {"model": {"n_layer": 2, "hidden": 32, "n_head": 4, "seq_len": 16,
                      "vocab_size": 64},
            "layout": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2, "grad_accum": 1,
                       "zero_stage": 0, "recompute": "none"},
            "run": {"warmup_steps": 1, "measure_steps": 2, "dtype": "fp32", "device": "cpu"}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "AUTOTUNE_ENERGY_ROOT": str(tmp_path / "no-sysfs")}
    done = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(tmp_path / "spec.json"),
                           "--result", str(tmp_path / "result.json")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok" and result["tokens_per_s"] > 0
    for key in ("energy_j_per_step", "energy_source", "joules_per_token",
                "model_tflops_per_watt"):
        assert key in result and result[key] is None, (key, result.get(key))
