"""The narrow reads a run ends with (the trials' history, the measurements of a refit) go
through the one retry layer: a connection the server closed once is waited out, not an
exit 1 (SQLite here; the fault test does it with a real server going away)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy.exc import OperationalError

from autotune.config.study import StorageConfig
from autotune.storage.db import Storage, open_storage
from autotune.storage.judged import judged_trials


def _fail_once(storage: Storage, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = storage.session

    @contextlib.contextmanager
    def session() -> Iterator[Any]:
        calls[0] += 1
        if calls[0] == 1:
            raise OperationalError("SELECT", {}, Exception(
                "server closed the connection unexpectedly"))
        with real() as s:
            yield s

    monkeypatch.setattr(storage, "session", session)
    return calls


def test_the_narrow_reads_wait_out_a_closed_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    storage = open_storage(StorageConfig(url=f"sqlite:///{tmp_path / 'r.db'}"))
    try:
        study = optuna.create_study(study_name="r", storage=storage.optuna,
                                    direction="maximize")
        study.tell(study.ask(), 1.0)
        calls = _fail_once(storage, monkeypatch)
        assert [t.value for t in judged_trials(storage, "r")] == [1.0]
        assert calls[0] == 2
        calls = _fail_once(storage, monkeypatch)
        assert storage.measurement_rows(["trial_id"], device_type="cpu", dtype="fp32",
                                        workload="builtin", outcomes=["complete"]) == []
        assert calls[0] == 2
        err = capsys.readouterr().err
        assert err.count("closed the connection; retry 1 in") == 2
    finally:
        storage.close()
