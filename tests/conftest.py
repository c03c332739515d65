"""Service fixtures for every test package: a real SLURM, PostgreSQL and MariaDB, or a
visible skip.

``.ci/services.sh`` brings the services up and writes ``/tmp/autotune-ci/env``; it is read
here so that a developer who ran the script once needs nothing else. Under ``CI=true``
a missing service is a test failure, never a skip.

The fixtures sit behind the markers of ``pyproject.toml``: a test that uses ``pg_url``
must be marked ``postgres``, one that uses ``slurm`` (or ``allocation``) ``slurm``, so that
``-m "not postgres"`` / ``-m "not slurm"`` deselects every test that needs the service
(:func:`pytest_collection_modifyitems` refuses an unmarked one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from tests import xdist_groups

ENV_FILE = Path(os.environ.get("AUTOTUNE_CI_ENV", "/tmp/autotune-ci/env"))
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL = "mysql+pymysql://root@127.0.0.1:3306/test"


def _load_env_file() -> None:
    if not ENV_FILE.is_file():
        return
    for line in ENV_FILE.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export "):].partition("=")
            os.environ.setdefault(key.strip(), value.strip())


_load_env_file()


def unavailable(what: str, why: str, script: str = ".ci/services.sh") -> None:
    """Fail under CI=true (the services must be there), skip with the reason otherwise."""
    msg = f"{what} unavailable: {why} (run `bash {script}` as root)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def slurm() -> None:
    """A SLURM controller with an idle node and working accounting (sacct)."""
    if shutil.which("sinfo") is None:
        unavailable("SLURM", "sinfo is not installed")
    try:
        info = _run(["sinfo", "-h", "-o", "%t"])
        acct = _run(["sacct", "-n", "-X", "-o", "JobID", "-S", "now"])
    except subprocess.TimeoutExpired:
        unavailable("SLURM", "sinfo/sacct timed out")
    if info.returncode != 0 or not any(s.strip().rstrip("*") in ("idle", "mix", "alloc")
                                       for s in info.stdout.split()):
        unavailable("SLURM", f"no usable node: {info.stdout.strip()} {info.stderr.strip()}")
    if acct.returncode != 0:
        unavailable("SLURM accounting", acct.stderr.strip())


def _db_reachable(url: str) -> str | None:
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(url, connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        engine.dispose()
        return None
    except Exception as err:  # any driver error: report it
        return str(err).splitlines()[0]


@pytest.fixture(scope="session")
def pg_url() -> str:
    url = os.environ.get("AUTOTUNE_TEST_PG_URL", DEFAULT_PG)
    why = _db_reachable(url)
    if why:
        unavailable("PostgreSQL", why)
    return url


@pytest.fixture(scope="session")
def mysql_url() -> str:
    url = os.environ.get("AUTOTUNE_TEST_MYSQL_URL", DEFAULT_MYSQL)
    why = _db_reachable(url)
    if why:
        unavailable("MySQL/MariaDB", why)
    return url


@pytest.fixture
def unique() -> str:
    """A study-name suffix unique to this test run (tests share the databases)."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def allocation(slurm: None) -> Iterator[str]:
    """A 4-CPU allocation held for the module (``salloc --no-shell``): steps go into it."""
    done = _run(["salloc", "--no-shell", "-N1", "-n4", "-t", "15", "-J", "autotune-tests"],
                timeout=120)
    job = next((w for w in done.stderr.split() if w.isdigit()), None)
    if done.returncode != 0 or job is None:
        pytest.fail(f"salloc failed: {done.stderr.strip()}")
    try:
        yield job
    finally:
        _run(["scancel", job])


SERVICE_MARKERS = {"pg_url": "postgres", "slurm": "slurm", "mn_cluster": "multinode",
                   "own_pg": "faults", "small_tmpfs": "faults",
                   "megatron_env": "megatron"}
"""Fixture -> the marker every test that uses it (directly or through another fixture,
e.g. ``allocation``) must carry."""


def pytest_configure(config: pytest.Config) -> None:
    # which tests share a pytest-xdist worker (scripts/test.sh runs 2)
    config.pluginmanager.register(xdist_groups, "autotune-xdist-groups")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [f"{item.nodeid} uses {fixture} without @pytest.mark.{marker}"
                for item in items for fixture, marker in SERVICE_MARKERS.items()
                if fixture in getattr(item, "fixturenames", ())
                and item.get_closest_marker(marker) is None]
    if unmarked:
        raise pytest.UsageError("service fixtures need their marker (so that -m 'not ...' "
                                "deselects the test):\n  " + "\n  ".join(unmarked))


@pytest.fixture
def seeded_db(tmp_path: Path) -> Path:
    """A database with one study of one trial: a refused run must leave it as it is."""
    db = tmp_path / "keep.db"
    study = optuna.create_study(study_name="keep", storage=f"sqlite:///{db}")
    study.add_trial(optuna.trial.create_trial(value=1.0, params={}, distributions={}))
    return db
