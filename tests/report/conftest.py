"""A synthetic finished study (every outcome), built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report import synthetic


@pytest.fixture(scope="session")
def synthetic_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("synthetic") / "study.db"
    synthetic.build(db).close()
    return db
