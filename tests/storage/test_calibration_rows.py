"""Schema v2: the ``workload`` column, the migration of a v1 database, and the one query
calibration makes (only the columns it names, of one device type, dtype and workload)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from autotune.config.study import StorageConfig
from autotune.storage.db import Storage
from autotune.storage.schema import SCHEMA_VERSION


def _row(study: str, launcher: str = "local", **over: Any) -> dict[str, Any]:
    row = {"study_name": study, "trial_number": 0, "trial_id": 1, "layout_key": "k",
           "tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "grad_accum": 4, "zero_stage": 0,
           "recompute": "none", "world_size": 2, "global_batch": 8, "model_name": "m",
           "n_layer": 2, "hidden": 32, "n_head": 4, "seq_len": 16, "vocab_size": 64,
           "n_params": 1e5, "device_type": "cpu", "nodes": 1, "devices_per_node": 2,
           "dtype": "fp32", "outcome": "complete", "launcher": launcher,
           "peak_memory_bytes": 5e8, "predicted_memory_bytes": 4.5e8,
           "model_tflops_per_device": 0.01, "predicted_tflops_per_device": 0.02,
           "started_at": datetime(2025, 1, 1), "finished_at": datetime(2025, 1, 1)}
    row.update(over)
    return row


def test_a_v1_database_is_migrated_and_its_replayed_rows_are_told_apart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v1.db'}"
    Storage(StorageConfig(url=url)).close()
    engine = create_engine(url)
    with engine.begin() as conn:  # make it what autotune v1 left behind
        conn.execute(text("ALTER TABLE measurements DROP COLUMN workload"))
        conn.execute(text("DELETE FROM autotune_schema"))
        conn.execute(text("INSERT INTO autotune_schema (version) VALUES (1)"))
        for study, launcher in (("a", "local"), ("b", "replay")):
            cols = {k: v for k, v in _row(study, launcher).items()}
            conn.execute(text(f"INSERT INTO measurements ({', '.join(cols)}) VALUES "
                              f"({', '.join(':' + k for k in cols)})"), cols)
    storage = Storage(StorageConfig(url=url))
    with engine.connect() as conn:
        assert dict(conn.execute(text("select study_name, workload from measurements")).all()) \
            == {"a": "builtin", "b": "replay"}
        assert conn.execute(text("select max(version) from autotune_schema")).scalar() \
            == SCHEMA_VERSION
    storage.close()
    Storage(StorageConfig(url=url)).close()  # opening it again changes nothing


def test_measurement_rows_reads_only_what_it_is_asked(tmp_path: Path) -> None:
    storage = Storage(StorageConfig(url=f"sqlite:///{tmp_path / 'rows.db'}"))
    for row in (_row("a"), _row("a", outcome="oom", peak_memory_bytes=None), _row("b"),
                _row("b", outcome="error"), _row("c", device_type="h100"),
                _row("d", dtype="bf16"), _row("e", workload="replay")):
        storage.add_measurement(row)
    cols = ("study_name", "outcome", "peak_memory_bytes")
    key = {"device_type": "cpu", "dtype": "fp32", "workload": "builtin",
           "outcomes": ("complete", "oom")}
    others = storage.measurement_rows(cols, **key, other_than="b")
    assert others == [{"study_name": "a", "outcome": "complete", "peak_memory_bytes": 5e8},
                      {"study_name": "a", "outcome": "oom", "peak_memory_bytes": None}]
    assert [r["study_name"] for r in storage.measurement_rows(cols, **key, study="b")] == ["b"]
    assert len(storage.measurement_rows(cols, **key, limit=1)) == 1
    with pytest.raises(ValueError, match="no column 'nope'"):
        storage.measurement_rows(("nope",), **key)
    storage.close()
