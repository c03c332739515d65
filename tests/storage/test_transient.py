"""Which database failures are waited out, how (one line each, then one error line), and
that Optuna's storage calls go through the same (issue 23 A, B): no service needed, the
clock and the sleep are injected."""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from autotune.cli import main
from autotune.config.study import StorageConfig
from autotune.errors import SpecError, StorageError
from autotune.storage.db import Storage
from autotune.storage.limits import session_statements
from autotune.storage.transient import retrying, transient_reason
from autotune.storage.urls import parse_url


def _driver_error(message: str) -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception(message))


def _optuna_error(message: str) -> optuna.exceptions.StorageInternalError:
    """What Optuna raises: its own words, the driver's error as the cause."""
    try:
        try:
            raise _driver_error(message)
        except OperationalError as err:
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit.") from err
    except optuna.exceptions.StorageInternalError as wrapped:
        return wrapped


@pytest.mark.parametrize("message", [
    # No code: a refusal at connect time, a connection lost on the client's side, SQLite.
    "connection failed: FATAL:  the database system is not yet accepting connections",
    "FATAL:  the database system is starting up",
    "FATAL:  sorry, too many clients already",
    "consuming input failed: server closed the connection unexpectedly",
    "connection socket closed",  # psycopg's waiting.py: the socket gone under a wait
    "FATAL:  terminating connection due to administrator command",
    "FATAL:  terminating connection due to idle-in-transaction timeout",
    "database is locked",
])
def test_a_passing_failure_is_transient_also_inside_optuna(message: str) -> None:
    assert transient_reason(_driver_error(message)) is not None
    assert transient_reason(_optuna_error(message)) is not None


def _coded(error: Exception) -> OperationalError:
    return OperationalError("SELECT 1", {}, error)


# A localised server (lc_messages = 'de_DE'): the code decides, not the words.
_GERMAN = "FEHLER:  Verklemmung (Deadlock) entdeckt"


@pytest.mark.parametrize("code, why", [
    ("57P01", "closed the connection"), ("57P03", "in crash recovery"),
    ("53300", "full (too many connections)"), ("40001", "could not serialize"),
    ("40P01", "deadlock"), ("55P03", "lock timeout"), ("57014", "statement past its timeout"),
    ("25P03", "idle past storage.transaction_timeout_s"),
])
def test_a_postgresql_failure_is_known_by_its_sqlstate(code: str, why: str) -> None:
    import psycopg.errors

    err = _coded(psycopg.errors.lookup(code)(_GERMAN))
    reason = transient_reason(err)
    assert reason is not None and why in reason
    wrapped = optuna.exceptions.StorageInternalError("An exception is raised during commit")
    wrapped.__cause__ = err
    assert transient_reason(wrapped) == reason


@pytest.mark.parametrize("errno, why", [
    (1040, "full"), (1205, "lock timeout"), (1213, "deadlock"), (2006, "closed"),
    (2013, "closed"), (1969, "statement past its timeout"), (4031, "closed"),
])
def test_a_mysql_failure_is_known_by_its_error_number(errno: int, why: str) -> None:
    import pymysql

    reason = transient_reason(_coded(pymysql.err.OperationalError(errno, "Fehler")))
    assert reason is not None and why in reason


def test_a_code_that_does_not_pass_is_not_waited_for_whatever_its_words() -> None:
    import psycopg.errors
    import pymysql

    # 23505 unique_violation, 1062 ER_DUP_ENTRY: their texts name a "deadlock" here.
    assert transient_reason(_coded(psycopg.errors.lookup("23505")("deadlock detected"))) is None
    assert transient_reason(_coded(pymysql.err.IntegrityError(1062, "deadlock found"))) is None
    refused = _coded(pymysql.err.OperationalError(2003, "Can't connect to MySQL server"))
    assert transient_reason(refused, connected=True) is not None
    assert transient_reason(refused, connected=False) is None


def test_the_give_up_line_counts_every_wait_of_the_outage(
        capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.storage.transient import Outage

    clock, outage = _Clock(), Outage()

    def down() -> None:
        raise _driver_error("server closed the connection unexpectedly")

    lines = 0
    for _ in range(2):  # two calls of one storage during one outage
        with pytest.raises(StorageError) as err:
            retrying("reading", "postgresql://u:***@db/t", down, wait_s=5,
                     sleep=clock.sleep, clock=clock, outage=outage)
        lines += len(capsys.readouterr().err.splitlines())
    assert f"and {lines} retries in all" in str(err.value)
    retrying("reading", "db", lambda: 1, wait_s=5, outage=outage)
    assert outage.waits == 0  # a call that passed ends the outage


def test_a_refused_connection_is_transient_only_after_a_first_connection() -> None:
    refused = _driver_error('connection failed: connection to server at "127.0.0.1", port '
                            "5432 failed: Connection refused")
    assert transient_reason(refused, connected=True) is not None
    assert transient_reason(refused, connected=False) is None  # a wrong URL: at once


@pytest.mark.parametrize("message", ["database or disk is full", "no such table: trials",
                                     'password authentication failed for user "tuner"'])
def test_other_failures_are_not_waited_for(message: str) -> None:
    assert transient_reason(_driver_error(message)) is None


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_an_outage_is_waited_out_with_one_line_per_wait(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock, calls = _Clock(), []

    def call() -> str:
        calls.append(clock.now)
        if len(calls) <= 3:
            raise _optuna_error("the database system is not yet accepting connections")
        return "recorded"

    assert retrying("worker h:1", "postgresql://u:***@db/t", call, wait_s=60,
                    sleep=clock.sleep, clock=clock) == "recorded"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all("in crash recovery; retry" in line for line in lines)
    assert [line.split("; retry ")[1].split()[0] for line in lines] == ["1", "2", "3"]
    assert calls[1] - calls[0] <= 0.75 and calls[3] - calls[2] <= 3.0  # doubling from 0.5 s


def test_a_long_outage_ends_in_one_error_naming_the_wait(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock = _Clock()

    def down() -> None:
        raise _driver_error("sorry, too many clients already")

    with pytest.raises(StorageError) as err:
        retrying("opening", "postgresql://u:***@db/t", down, wait_s=120, sleep=clock.sleep,
                 clock=clock)
    message = str(err.value)
    assert "full (too many connections)" in message and "gave up after waiting" in message
    assert "outage_wait_s=120" in message and "\n" not in message
    waits = capsys.readouterr().err.splitlines()
    assert 5 <= len(waits) <= 20 and clock.now >= 120  # 16 s at most between tries


def test_a_failure_that_does_not_pass_is_translated_at_once(tmp_path: Path) -> None:
    storage = Storage(StorageConfig(url=f"sqlite:///{tmp_path / 'a.db'}"))
    calls = []

    def full() -> None:
        calls.append(1)
        raise _optuna_error("database or disk is full")

    with pytest.raises(StorageError, match="database or disk is full") as err:
        storage.retrying("recording", full)
    assert len(calls) == 1 and "An exception is raised" not in str(err.value)
    storage.close()


def test_optuna_calls_are_waited_out_and_translated(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage(StorageConfig(url=f"sqlite:///{tmp_path / 'b.db'}"))
    study = optuna.create_study(study_name="s", storage=storage.optuna)
    inner = storage.optuna._inner  # type: ignore[attr-defined]
    real, failures = inner.get_all_trials, [_optuna_error("database is locked")]

    def flaky(*args: object, **kwargs: object) -> object:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(inner, "get_all_trials", flaky)
    monkeypatch.setattr("autotune.storage.transient.time.sleep", lambda s: None)
    assert study.get_trials() == []  # waited out
    failures.append(_optuna_error("disk I/O error"))
    with pytest.raises(StorageError, match="disk I/O error"):
        study.get_trials()
    with pytest.raises(KeyError):  # Optuna's answers pass as they are
        optuna.load_study(study_name="nothing", storage=storage.optuna)
    storage.close()


def test_a_database_error_that_escaped_is_one_line_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise _driver_error("server closed the connection unexpectedly\n\tThis probably...")

    monkeypatch.setattr("autotune.cli.commands.cmd_status", broken)
    assert main(["status", "x"]) == 1
    err = capsys.readouterr().err
    assert err == "autotune: error: database error: server closed the connection " \
                  "unexpectedly\n"


def test_sqlite_waits_the_transaction_timeout_for_its_lock(tmp_path: Path) -> None:
    storage = Storage(StorageConfig(url=f"sqlite:///{tmp_path / 'c.db'}",
                                    transaction_timeout_s=7))
    with storage.engine.connect() as conn:
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 7000
    storage.close()


def test_session_limits_follow_the_transaction_timeout() -> None:
    assert session_statements("postgresql", 10) == [
        "SET idle_in_transaction_session_timeout = 10000", "SET lock_timeout = 20000",
        "SET statement_timeout = 20000"]
    assert "SET SESSION wait_timeout = 60" in session_statements("mysql", 10)
    assert session_statements("sqlite", 10) == []


def test_an_unencoded_at_sign_before_a_colon_gets_the_hint() -> None:
    """``user:p@ss:word@host/db`` read as host ``ss`` and port ``word@host``: it was
    reported as "a port that is not a number"."""
    with pytest.raises(SpecError) as err:
        parse_url("postgresql+psycopg://user:p@ss:word@host/db")
    assert "unencoded '@'" in str(err.value) and "%40" in str(err.value)
    assert "ss:word" not in str(err.value)
    with pytest.raises(SpecError, match="a port that is not a number"):
        parse_url("postgresql+psycopg://user:pw@host:abc/db")


def test_each_mariadb_connection_carries_its_limits(mysql_url: str) -> None:
    storage = Storage(StorageConfig(url=mysql_url, transaction_timeout_s=7))
    with storage.engine.connect() as conn:
        version = str(conn.execute(text("SELECT VERSION()")).scalar())
        lock_wait = conn.execute(text("SELECT @@session.innodb_lock_wait_timeout")).scalar()
        idle = conn.execute(text(
            "SELECT @@session.idle_transaction_timeout" if "MariaDB" in version
            else "SELECT @@session.wait_timeout")).scalar()
    storage.close()
    assert int(lock_wait) == 14
    assert int(idle) == (7 if "MariaDB" in version else 60)


def test_a_failure_while_handling_another_is_judged_by_itself() -> None:
    """Optuna's ``create_study`` looks the study up after a ``DuplicatedStudyError`` (a
    worker started at the same moment created it): a connection that dies there carries
    the handled unique violation as its ``__context__``. That earlier, handled failure
    (23505, not transient) is not its cause: the dropped connection is waited out (CI: a
    worker exited 1 on it while its database's sessions were being terminated)."""
    import psycopg.errors

    def lookup_after_duplicate() -> BaseException:
        try:
            try:
                raise _coded(psycopg.errors.lookup("23505")("duplicate key value"))
            except OperationalError:  # handled: Optuna then reads the study's id
                # Raised as Optuna's code raises it: no ``from``, the handled error its context.
                raise _driver_error(  # noqa: B904
                    "consuming input failed: server closed the connection unexpectedly")
        except OperationalError as err:
            return err

    err = lookup_after_duplicate()
    assert err.__context__ is not None and not err.__suppress_context__
    assert transient_reason(err) == "closed the connection"
    wrapped = optuna.exceptions.StorageInternalError("An exception is raised during commit")
    wrapped.__cause__ = err
    assert transient_reason(wrapped) == "closed the connection"
    # A translation (``raise ... from None``) is still read through to what it translates.
    try:
        try:
            raise _coded(psycopg.errors.lookup("57P01")("terminating connection"))
        except OperationalError:
            raise StorageError("database error on ...: terminating connection") from None
    except StorageError as translated:
        assert transient_reason(translated) == "closed the connection"
