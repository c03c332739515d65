"""Schema v5: a trial's ``measurements`` row says which program ran (``builtin``,
``command``, ``megatron-deepspeed``, ``replay``), and calibration keys on it: a study of the
user's own program and one of the built-in trainer never learn from each other."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
from sqlalchemy import create_engine, text

from autotune.config.study import StorageConfig
from autotune.runner.learning import earlier_rows, key_of, plan_calibration, workload_of
from autotune.spec import load_study
from autotune.storage.db import Storage
from autotune.storage.schema import SCHEMA_VERSION
from tests.helpers import REPO, run_cli, write_study
from tests.storage.test_calibration_rows import _row

PROGRAMS = REPO / "tests" / "workloads" / "programs"
ONE_RANK = {"tp": [1], "pp": [1], "zero_stage": [0], "recompute": ["none"],
            "strategy": "cost-model-only"}


def test_a_v3_database_gets_each_study_s_own_workload(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v3.db'}"
    Storage(StorageConfig(url=url)).close()
    # What autotune v3 left: every local row `builtin`, whatever the study ran.
    for name, attrs in (("cmd", {"workload": {"kind": "command", "argv": ["x"]}}),
                        ("mega", {"fingerprint": {"workload": "megatron-deepspeed"}}),
                        ("own", {"workload": {"kind": "builtin"}}), ("bare", {})):
        study = optuna.create_study(study_name=name, storage=url)
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM autotune_schema"))
        conn.execute(text("INSERT INTO autotune_schema (version) VALUES (3)"))
        for study, launcher in (("cmd", "local"), ("cmd", "slurm"), ("mega", "local"),
                                ("own", "local"), ("bare", "local"), ("rep", "replay")):
            cols = _row(study, launcher, workload="replay" if launcher == "replay"
                        else "builtin")
            conn.execute(text(f"INSERT INTO measurements ({', '.join(cols)}) VALUES "
                              f"({', '.join(':' + k for k in cols)})"), cols)
    Storage(StorageConfig(url=url)).close()
    with engine.connect() as conn:
        rows = conn.execute(text("select study_name, launcher, workload from measurements "
                                 "order by id")).all()
        assert [tuple(r) for r in rows] == [
            ("cmd", "local", "command"), ("cmd", "slurm", "command"),
            ("mega", "local", "megatron-deepspeed"), ("own", "local", "builtin"),
            ("bare", "local", "builtin"), ("rep", "replay", "replay")]
        assert conn.execute(text("select max(version) from autotune_schema")).scalar() \
            == SCHEMA_VERSION


def test_workload_of_names_the_program_not_the_launcher() -> None:
    assert [workload_of(launcher, kind) for launcher, kind in (
        ("local", "builtin"), ("slurm", "command"), ("local", "megatron-deepspeed"),
        ("replay", "megatron-deepspeed"))] == ["builtin", "command", "megatron-deepspeed",
                                               "replay"]


@pytest.mark.slow
def test_a_command_study_and_a_builtin_study_never_learn_from_each_other(
        tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    builtin = write_study(tmp_path / "trainer.yaml", name="trainer", devices=1, n_trials=1,
                          db=db, search={**ONE_RANK, "micro_batch": [1], "n_trials": 1})
    spec = load_study(builtin)
    storage = Storage(spec.storage)
    # The built-in trainer's measurements, as its runs store them (trial ids of their own
    # study, which the command study's never meet; the trainer itself is
    # tested elsewhere; here only the label matters).
    for number, mb in enumerate((1, 2)):
        storage.add_measurement(_row("trainer-before", trial_number=number, micro_batch=mb,
                                     trial_id=10_000 + number,
                                     dp=1, world_size=1, global_batch=8,
                                     grad_accum=8 // mb))
    storage.close()
    argv = [sys.executable, str(PROGRAMS / "fake_trainer.py"), "--steps", "{train_iters}",
            "--micro-batch", "{micro_batch}"]
    command = write_study(tmp_path / "cmd.yaml", name="cmd", devices=1, n_trials=2, db=db,
                          search={**ONE_RANK, "micro_batch": [1, 2], "n_trials": 2},
                          workload={"kind": "command", "argv": argv,
                                    "env": {"PYTHONPATH": str(REPO)}})
    proc = run_cli("run", str(command), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no earlier study of cpu/fp32/command" in proc.stdout + proc.stderr
    with create_engine(f"sqlite:///{db}").connect() as conn:
        labels = conn.execute(text("select study_name, workload, outcome from measurements "
                                   "order by id")).all()
    assert sorted(tuple(r) for r in labels) == [
        ("cmd", "command", "complete"), ("cmd", "command", "complete"),
        ("trainer-before", "builtin", "complete"), ("trainer-before", "builtin", "complete")]
    # The built-in study's warm start reads the trainer's rows, never the command's ...
    storage = Storage(spec.storage)
    try:
        rows = earlier_rows(storage, key_of(spec, workload_of("local", "builtin")), "trainer")
        assert {r.study for r in rows} == {"trainer-before"}
        cmd_spec = load_study(command)
        rows = earlier_rows(storage, key_of(cmd_spec, workload_of("local", "command")), "x")
        assert {r.study for r in rows} == {"cmd"}
    finally:
        storage.close()
    # ... and so does `autotune plan`'s calibration.
    calibration, _, _, note = plan_calibration(spec)
    assert note is None and calibration is not None
    assert calibration.key.workload == "builtin"
    assert dict(calibration.learned_from) == {"trainer-before": 2}


def test_plan_storage_calibrates_from_the_database_it_names(tmp_path: Path) -> None:
    db = tmp_path / "elsewhere.db"
    storage = Storage(StorageConfig(url=f"sqlite:///{db}"))
    for number, mb in enumerate((1, 2)):
        storage.add_measurement(_row("before", trial_number=number, trial_id=100 + number,
                                     micro_batch=mb, dp=1, world_size=1, grad_accum=8 // mb))
    storage.close()
    path = write_study(tmp_path / "p.yaml", name="p", devices=1,  # its own db: none yet
                       search={**ONE_RANK, "micro_batch": [1, 2], "n_trials": 2})
    plain = run_cli("plan", str(path), "--top", "1")
    named = run_cli("plan", str(path), "--top", "1", "--storage", f"sqlite:///{db}")
    assert plain.returncode == named.returncode == 0, named.stderr
    assert "cal_TFLOPS" not in plain.stdout and "learned from" not in plain.stdout
    assert "learned from 1 earlier study of cpu/fp32/builtin (before: 2 measurements)" \
        in named.stdout and "cal_TFLOPS" in named.stdout
    assert not (tmp_path / "study.db").exists()  # the study file's database untouched
