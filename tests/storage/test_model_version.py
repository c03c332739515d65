"""Schema v8: each measurement row says which version of the models predicted it, and the
warm start leaves out another version's rows (autotune/models/version.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from autotune.cli import main
from autotune.config.study import StorageConfig
from autotune.models.version import model_version, stale
from autotune.runner.learning import key_of, plan_calibration, warm_start, workload_of
from autotune.spec import load_study
from autotune.storage.db import Storage
from autotune.storage.schema import SCHEMA_VERSION
from tests.replay_study import own_pg_database, write_replay_study
from tests.storage.test_calibration_rows import _row

OTHER = "0123456789abcdef"  # a version these models are not


def test_the_version_is_a_digest_of_the_models_source() -> None:
    version = model_version()
    assert len(version) == 16 and int(version, 16) >= 0 and version != OTHER
    assert not stale(version) and stale(OTHER)
    assert not stale(None)  # a row of schema v7 or older: kept, as before


def test_a_replayed_study_records_the_version_and_a_later_one_leaves_out_other_versions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = write_replay_study(tmp_path / "a", name="first", url=url, n_trials=3)
    assert main(["run", str(first)]) == 0
    engine = create_engine(url)
    with engine.connect() as conn:
        versions = conn.execute(text("select model_version from measurements "
                                     "where outcome = 'complete'")).scalars().all()
    assert len(versions) == 3 and set(versions) == {model_version()}
    second = write_replay_study(tmp_path / "b", name="second", url=url, n_trials=3)
    spec = load_study(second)
    key = key_of(spec, workload_of("replay"))
    storage = Storage(spec.storage)
    try:
        rows, old = warm_start(storage, key, "second")
        assert (len(rows), old) == (3, 0)
        cal_before, *_ = plan_calibration(spec)
        assert cal_before is not None and cal_before.throughput.n_ok == 3
        # One of the three rows was predicted by other models (autotune upgraded since).
        with engine.begin() as conn:
            conn.execute(text("update measurements set model_version = :v where id = "
                              "(select min(id) from measurements where outcome = "
                              "'complete')"), {"v": OTHER})
        rows, old = warm_start(storage, key, "second")
        assert (len(rows), old) == (2, 1)
    finally:
        storage.close()
    cal, *_ = plan_calibration(spec)
    assert cal is not None and cal.stale == 1 and cal.throughput.n_ok == 2
    assert dict(cal.learned_from) == {"first": 2}
    capsys.readouterr()
    assert main(["plan", str(second), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "learned from 1 earlier study" in out and "(first: 2 measurements)" in out
    assert "(1 earlier row left out: predicted by another version of autotune's models)" in out
    # The study's own rows of another version still say the layout ran, but give no ratio.
    own = load_study(first)
    cal_own, _, fits, _ = plan_calibration(own, learn=False)
    assert cal_own is not None and cal_own.own == 3 and len(fits) == 3
    assert cal_own.throughput.n_ok == 2


def _make_v7(url: str) -> None:
    """A database as autotune's schema v7 left it: no ``model_version``, two rows."""
    Storage(StorageConfig(url=url)).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE measurements DROP COLUMN model_version"))
        conn.execute(text("DELETE FROM autotune_schema"))
        conn.execute(text("INSERT INTO autotune_schema (version) VALUES (7)"))
        for study in ("a", "b"):
            cols = _row(study, workload="builtin")
            conn.execute(text(f"INSERT INTO measurements ({', '.join(cols)}) VALUES "
                              f"({', '.join(':' + k for k in cols)})"), cols)
    engine.dispose()


@pytest.mark.postgres
def test_a_v7_postgresql_database_gets_the_column(pg_url: str) -> None:
    with own_pg_database(pg_url, prefix="autotune_v8") as url:
        _make_v7(url)
        storage = Storage(StorageConfig(url=url))
        try:
            storage.add_measurement(_row("c", model_version=model_version()))
            engine = create_engine(url)
            with engine.connect() as conn:
                assert conn.execute(text("select max(version) from autotune_schema")
                                    ).scalar() == SCHEMA_VERSION
                assert dict(conn.execute(text("select study_name, model_version from "
                                              "measurements")).all()) \
                    == {"a": None, "b": None, "c": model_version()}
            engine.dispose()
        finally:
            storage.close()


def test_a_v7_database_gets_the_column_and_keeps_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v7.db'}"
    _make_v7(url)
    engine = create_engine(url)
    storage = Storage(StorageConfig(url=url))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("select max(version) from autotune_schema")).scalar() \
                == SCHEMA_VERSION == 8
            assert conn.execute(text("select model_version from measurements")
                                ).scalars().all() == [None, None]
        spec = load_study(write_study_file(tmp_path, url))
        rows, old = warm_start(storage, key_of(spec, "builtin"), "c")
        assert ({r.study for r in rows}, old) == ({"a", "b"}, 0)
        assert all(r.predicted_memory_bytes == 4.5e8 for r in rows)  # ratios kept
    finally:
        storage.close()
    Storage(StorageConfig(url=url)).close()  # opening it again changes nothing


def write_study_file(directory: Path, url: str) -> Path:
    """A cpu/fp32/builtin study on ``url`` (the key of :func:`_row`'s rows)."""
    path = directory / "c.yaml"
    path.write_text(f"""name: c
model: {{n_layer: 2, hidden: 32, n_head: 4, seq_len: 16, vocab_size: 64}}
cluster: {{nodes: 1, devices_per_node: 2, device: cpu}}
training: {{global_batch: 8, dtype: fp32}}
storage: {{url: "{url}"}}
""")
    return path
