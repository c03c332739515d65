"""Read-only commands refuse a SQLite file that is not there, naming its absolute path and
creating nothing; a study file's relative SQLite URL names a file next to the study file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.cli import main
from autotune.config.sqlite_file import next_to, nothing_to_read, require_existing
from autotune.errors import SpecError, UsageError
from autotune.spec import load_study
from tests.helpers import run_cli, write_study


@pytest.mark.parametrize("argv", [["status"], ["best", "cpu-demo"], ["report", "cpu-demo"],
                                  ["report", "--all"]])
def test_read_only_commands_refuse_a_missing_file(argv: list[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--storage", "sqlite:///typo.db"]) == 2
    err = capsys.readouterr().err
    assert f"no database at {tmp_path / 'typo.db'}" in err, err
    assert list(tmp_path.iterdir()) == []  # no database, no report folder


def test_a_study_file_names_its_missing_database(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    study = write_study(tmp_path / "s.yaml", db=tmp_path / "gone" / "s.db")
    assert main(["best", str(study)]) == 2
    assert f"no database at {tmp_path / 'gone' / 's.db'}" in capsys.readouterr().err
    assert not (tmp_path / "gone").exists()


def test_relative_sqlite_url_resolves_next_to_the_study_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "studies"
    folder.mkdir()
    study = write_study(folder / "s.yaml")
    data = yaml.safe_load(study.read_text())
    data["storage"]["url"] = "sqlite:///rel.db"
    study.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    assert load_study(Path("studies") / "s.yaml").storage.url == \
        f"sqlite:///{folder.resolve() / 'rel.db'}"


def test_urls_left_alone_and_memory_databases() -> None:
    assert next_to("sqlite:////abs/x.db", "/b") == "sqlite:////abs/x.db"
    assert next_to("postgresql+psycopg://u@h/db", "/b") == "postgresql+psycopg://u@h/db"
    assert next_to("sqlite:///${DIR}/x.db", "/b") == "sqlite:///${DIR}/x.db"
    require_existing("sqlite://", "status")  # in memory: nothing to find
    with pytest.raises(UsageError, match=r"no database at /nowhere/x\.db"):
        require_existing("sqlite:////nowhere/x.db", "status")


def test_nothing_to_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "there.db").write_bytes(b"")
    monkeypatch.setenv("DBDIR", str(tmp_path))
    monkeypatch.delenv("UNSET_DBDIR", raising=False)
    assert nothing_to_read("sqlite://") and nothing_to_read("sqlite:///:memory:")
    assert nothing_to_read(f"sqlite:///{tmp_path / 'gone.db'}")
    assert nothing_to_read("sqlite:///${DBDIR}/gone.db")  # expanded, then looked for
    assert not nothing_to_read(f"sqlite:///{tmp_path / 'there.db'}")
    assert not nothing_to_read("sqlite:///${DBDIR}/there.db")
    assert not nothing_to_read("sqlite:///${UNSET_DBDIR}/x.db")  # opening it names the variable
    assert not nothing_to_read("postgresql+psycopg://u@127.0.0.1/test")


def test_plan_without_a_database_loads_no_database_layer(tmp_path: Path) -> None:
    """`plan` of a study that has not run opens nothing, creates nothing and imports
    neither the storage layer, Alembic nor Optuna: their ~0.7 s of imports would be a
    third of a 175B plan's 2 s CPU budget (benchmarks/plan_cpu_time.py)."""
    study = write_study(tmp_path / "s.yaml", db=tmp_path / "s.db")
    code = ("import sys\nfrom autotune.cli import main\n"
            f"rc = main(['plan', {str(study)!r}, '--top', '3'])\n"
            "loaded = sorted(m for m in ('autotune.storage', 'alembic', 'optuna')\n"
            "                if m in sys.modules)\n"
            "print('LOADED', loaded, rc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "LOADED [] 0" in out, out
    assert not (tmp_path / "s.db").exists()


def test_optuna_is_quiet_wherever_it_loads(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command but a plan without a database turns Optuna's INFO lines off; a plan
    that reads a database does too."""
    import optuna

    monkeypatch.chdir(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.INFO)
    main(["status", "--storage", "sqlite:///typo.db"])
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING
    optuna.logging.set_verbosity(optuna.logging.INFO)
    study = write_study(tmp_path / "s.yaml", db=tmp_path / "s.db")
    assert main(["plan", str(study), "--top", "2"]) == 0  # no database: Optuna untouched
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="other")
    assert main(["plan", str(study), "--top", "2"]) == 0
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_a_sqlite_url_without_a_file_is_refused_naming_it(url: str, tmp_path: Path) -> None:
    # SQLAlchemy opens an in-memory database for these: before, `run` failed with "database
    # error: no such table: version_info" (exit 1), and nothing could have been kept.
    from autotune.config.storage import StorageConfig
    from autotune.storage import Storage

    with pytest.raises(SpecError, match=r"storage\.url: got 'sqlite:.*'; a SQLite URL without "
                                        r"a file; allowed: sqlite:///FILE"):
        Storage(StorageConfig(url=url))
    study = write_study(tmp_path / "s.yaml")
    proc = run_cli("run", str(study), "--storage", url)
    assert proc.returncode == 2 and "a SQLite URL without a file" in proc.stderr


def test_a_sqlite_url_naming_a_folder_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: `run` exit 1 "cannot open the database ...: unable to open database file";
    # `status` said "no database at FOLDER", though the folder is there.
    from autotune.config.storage import StorageConfig
    from autotune.storage import Storage

    url = f"sqlite:///{tmp_path}/"
    with pytest.raises(SpecError, match=r"names a folder; allowed: a SQLite file in it"):
        Storage(StorageConfig(url=url))
    assert main(["status", "--storage", url]) == 2
    assert f"{tmp_path} (from {url}) is a folder, not a database file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_password_file_that_cannot_be_read_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.storage.urls import resolve_url

    binary = tmp_path / "pw.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\xd0\xff")
    url = "postgresql+psycopg://tuner@db.example.org:5432/tuning"
    for path, reason in ((binary, "not UTF-8 text"),  # before: a UnicodeDecodeError traceback
                         (tmp_path, "cannot be read (Is a directory)"),
                         (tmp_path / "gone", "cannot be read (No such file or directory)")):
        monkeypatch.setenv("AUTOTUNE_DB_PASSWORD_FILE", str(path))
        with pytest.raises(SpecError) as err:
            resolve_url(url)
        assert err.value.field == "AUTOTUNE_DB_PASSWORD_FILE" and reason in str(err.value)
    good = tmp_path / "pw"
    good.write_text("s3cret\n")
    monkeypatch.setenv("AUTOTUNE_DB_PASSWORD_FILE", str(good))
    assert ":s3cret@" in resolve_url(url)
