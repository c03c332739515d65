"""Schema v3: claims with leases, the migration of a v2 database, the one-transaction claim
and record, and the repair of a dead runner's trial (issue #17)."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from autotune.config.study import StorageConfig
from autotune.storage.claims import (
    Claimed,
    ClaimRequest,
    Refused,
    claim_counts,
    claim_first,
    claim_layout,
    record_execution,
    repair_stale,
)
from autotune.storage.db import Storage
from autotune.storage.schema import SCHEMA_VERSION
from tests.storage.test_calibration_rows import _row


def test_a_v2_database_is_migrated_and_an_unjudged_failed_claim_waits_for_a_retry(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v2.db'}"
    Storage(StorageConfig(url=url)).close()
    study = optuna.create_study(study_name="old", storage=url)
    stale, interrupted, done = study.ask(), study.ask(), study.ask()
    interrupted.set_user_attr("outcome", "interrupted")
    done.set_user_attr("outcome", "complete")
    for trial, state in ((stale, TrialState.FAIL), (interrupted, TrialState.FAIL),
                         (done, TrialState.COMPLETE)):
        study.tell(trial, 1.0 if state == TrialState.COMPLETE else None, state=state)
    engine = create_engine(url)
    with engine.begin() as conn:  # make it what autotune v2 left behind
        for column in ("lease_until", "attempts", "retry"):
            conn.execute(text(f"ALTER TABLE layout_claims DROP COLUMN {column}"))
        conn.execute(text("DELETE FROM autotune_schema"))
        conn.execute(text("INSERT INTO autotune_schema (version) VALUES (2)"))
        for key, trial in (("a", stale), ("b", interrupted), ("c", done)):
            conn.execute(text("INSERT INTO layout_claims (study_name, layout_key, trial_id, "
                              "worker, created_at) VALUES ('old', :k, :t, 'w', "
                              "'2026-01-01 00:00:00')"), {"k": key, "t": trial._trial_id})
    storage = Storage(StorageConfig(url=url))
    with engine.connect() as conn:
        assert dict(conn.execute(text("select layout_key, retry from layout_claims")).all()) \
            == {"a": 1, "b": 1, "c": 0}
        assert conn.execute(text("select max(version) from autotune_schema")).scalar() \
            == SCHEMA_VERSION
    assert claim_counts(storage, "old").retries == 2
    storage.close()
    engine.dispose()


def test_a_claim_creates_its_trial_and_a_refused_one_stores_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    storage = Storage(StorageConfig(url=url, heartbeat_interval_s=1, grace_period_s=2))
    optuna.create_study(study_name="s", storage=storage.optuna)
    row = _row("s")

    def claim(key: str, n: int = 2) -> Claimed | Refused:
        return claim_layout(storage, study_name="s", key=key, n_trials=n, worker="nohost:1",
                            params={}, user_attrs={"layout": key}, measurement=row)

    first = claim("a")
    assert isinstance(first, Claimed) and first.number == 0
    assert claim("a") is Refused.TAKEN  # running: its owner measures it
    assert isinstance(claim("b"), Claimed)
    assert claim("c") is Refused.BUDGET
    study = optuna.load_study(study_name="s", storage=url)
    assert [t.state for t in study.trials] == [TrialState.RUNNING] * 2  # nothing else stored
    assert record_execution(storage, trial_id=first.trial_id, state=TrialState.COMPLETE,
                            value=2.5, user_attrs={"outcome": "complete"},
                            system_attrs={"constraints:feasible": 0.0},
                            measurement={**row, "outcome": "complete"}, retry=False)
    trial = optuna.load_study(study_name="s", storage=url).trials[0]
    assert trial.state == TrialState.COMPLETE and trial.value == 2.5
    assert trial.system_attrs["constraints:feasible"] == 0.0
    with storage.session() as s:
        outcomes = sorted(r[0] for r in s.execute(text("select outcome from measurements")))
    assert outcomes == ["complete", "running"]
    storage.close()


def test_claim_first_takes_the_first_free_layout_of_a_worker_s_proposals(
        tmp_path: Path) -> None:
    """A worker racing others passes its next proposals: the first one nobody holds is
    claimed, the budget still counts every claim, and nothing is stored for the rest."""
    url = f"sqlite:///{tmp_path / 'f.db'}"
    storage = Storage(StorageConfig(url=url, heartbeat_interval_s=1, grace_period_s=60))
    optuna.create_study(study_name="s", storage=storage.optuna)
    row = _row("s")

    def first(*keys: str, n: int = 3) -> tuple[int, Claimed] | Refused:
        return claim_first(storage, study_name="s", n_trials=n, worker="nohost:1",
                           requests=[ClaimRequest(k, {}, {"layout": k}, row) for k in keys])

    got = first("a")
    assert not isinstance(got, Refused) and got[0] == 0
    got = first("a", "b", "c")  # a is taken: b, the next proposal, is claimed
    assert not isinstance(got, Refused) and got[0] == 1
    assert first("a", "b") is Refused.TAKEN
    assert first("a", "b", "c", "d", n=2) is Refused.BUDGET
    got = first("b", "d")
    assert not isinstance(got, Refused) and got[0] == 1 and got[1].number == 2
    study = optuna.load_study(study_name="s", storage=url)
    assert [t.user_attrs["layout"] for t in study.trials] == ["a", "b", "d"]
    assert claim_counts(storage, "s").claimed == 3
    storage.close()


def test_a_dead_runner_s_trial_is_repaired_once_its_lease_ran_out(tmp_path: Path) -> None:
    import time

    url = f"sqlite:///{tmp_path / 'r.db'}"
    storage = Storage(StorageConfig(url=url, heartbeat_interval_s=1, grace_period_s=2))
    optuna.create_study(study_name="s", storage=storage.optuna)
    claimed = claim_layout(storage, study_name="s", key="a", n_trials=1,
                           worker="elsewhere:1", params={}, user_attrs={"layout": "a"},
                           measurement=_row("s"))
    assert isinstance(claimed, Claimed)
    assert repair_stale(storage, "s") == 0  # its lease is live
    assert claim_counts(storage, "s").live == 1
    # Poll rather than sleep past the 2 s lease: the repair happens once it has run out,
    # however loaded the machine (a fixed sleep is either slow or, under load, too short).
    deadline = time.monotonic() + 30
    while (repaired := repair_stale(storage, "s")) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert repaired == 1
    counts = claim_counts(storage, "s")
    assert (counts.claimed, counts.retries, counts.live) == (1, 1, 0)
    trial = optuna.load_study(study_name="s", storage=url).trials[0]
    assert trial.state == TrialState.FAIL and trial.user_attrs["outcome"] == "killed"
    # A late record of the repaired trial writes nothing (its retry is the claim's now).
    assert not record_execution(storage, trial_id=claimed.trial_id, state=TrialState.COMPLETE,
                                value=1.0, user_attrs={}, system_attrs={},
                                measurement=_row("s"), retry=False)
    retry = claim_layout(storage, study_name="s", key="a", n_trials=1, worker="here:2",
                         params={}, user_attrs={"layout": "a"}, measurement=_row("s"))
    assert isinstance(retry, Claimed) and retry.attempt == 2  # within the budget of 1
    with storage.session() as s:
        assert sorted(r[0] for r in s.execute(text("select outcome from measurements"))) \
            == ["killed", "running"]
    storage.close()
