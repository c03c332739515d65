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
            == SCHEMA_VERSION
    storage.close()
    Storage(StorageConfig(url=url)).close()  # opening it again changes nothing
    engine.dispose()


@pytest.mark.slow
def test_a_cpu_trial_without_counters_says_not_measured(tmp_path: Path) -> None:
    spec = {"model": {"n_layer": 2, "hidden": 32, "n_head": 4, "seq_len": 16,
                      "vocab_size": 64},
            "layout": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2, "grad_accum": 1,
                       "zero_stage": 0, "recompute": "none"},
            "run": {"warmup_steps": 1, "measure_steps": 2, "measure_precision": None,
                    "dtype": "fp32", "device": "cpu"}}
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


class _Rapl:
    """A RAPL package zone whose ``energy_uj`` advances at ``watts`` with the clock, as
    the hardware's does (rewritten atomically every 2 ms by a thread: readers see whole
    values), until stopped."""

    def __init__(self, root: Path, watts: float) -> None:
        import threading

        self.zone = root / "sys" / "class" / "powercap" / "intel-rapl:0"
        self.zone.mkdir(parents=True)
        (self.zone / "name").write_text("package-0\n")
        (self.zone / "max_energy_range_uj").write_text("262143328850\n")
        self.watts, self.stop = watts, threading.Event()
        self._write()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        import time

        tmp = self.zone / "energy_uj.tmp"
        tmp.write_text(f"{int(time.monotonic() * self.watts * 1e6) % 262143328850}\n")
        tmp.replace(self.zone / "energy_uj")

    def _run(self) -> None:
        while not self.stop.wait(0.002):
            self._write()


@pytest.mark.slow
def test_two_ranks_on_one_host_count_its_rapl_packages_once(tmp_path: Path) -> None:
    spec = {"model": {"n_layer": 2, "hidden": 32, "n_head": 4, "seq_len": 16,
                      "vocab_size": 64},
            "layout": {"tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "grad_accum": 2,
                       "zero_stage": 0, "recompute": "none"},
            "run": {"warmup_steps": 1, "measure_steps": 3, "measure_precision": None,
                    "dtype": "fp32", "device": "cpu"}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    watts = 1000.0
    rapl = _Rapl(tmp_path / "sysfs", watts)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "AUTOTUNE_ENERGY_ROOT": str(tmp_path / "sysfs")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", "-m", "trainer", "--spec", str(tmp_path / "spec.json"),
             "--result", str(tmp_path / "result.json")], env=env, cwd=REPO,
            capture_output=True, text=True, timeout=300)
    finally:
        rapl.stop.set()
        rapl.thread.join()
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["status"] == "ok" and r["energy_source"] == "rapl"
    steps = len(r["step_times_s"])
    # One package counted once (not once per rank): joules over the timed region at the
    # counter's 1 kW, within the 2 ms rewrite and the region's few inter-step broadcasts.
    measured_s = r["energy_j_per_step"] * steps / watts
    assert sum(r["step_times_s"]) * 0.8 < measured_s < r["timings_s"]["measure"] * 1.5 + 0.05
    assert r["joules_per_token"] == pytest.approx(r["energy_j_per_step"]
                                                  / r["tokens_per_step"])
    assert r["model_tflops_per_watt"] == pytest.approx(
        r["model_flops_per_step"] / r["energy_j_per_step"] / 1e12)
