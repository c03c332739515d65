"""Campaigns end to end on the CI cluster: real sbatch arrays, the real runner and trainer
(CPU, 2 ranks per trial), PostgreSQL shared by every worker."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, text

from tests.helpers import REPO, run_cli, wait_for_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.postgres, pytest.mark.slow]

CI_STUDY = REPO / "studies" / "campaigns" / "ci-tiny.yaml"


def write_campaign(tmp_path: Path, url: str, names: list[str], *, workers: int,
                   max_continuations: int, n_trials: int, batch_size: int | None = None) -> Path:
    study = yaml.safe_load(CI_STUDY.read_text())
    study["search"]["n_trials"] = n_trials
    if batch_size is not None:
        study.setdefault("trial", {})["batch_size"] = batch_size
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    campaign = {
        "name": "t", "storage": {"url": url}, "site": "local-ci",
        "slurm": {"time": "00:10:00", "workers": workers,
                  "max_continuations": max_continuations},
        "studies": [{"file": "study.yaml", "name": n, "overrides": {"search": {"seed": i}}}
                    for i, n in enumerate(names)],
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))
    return path


def cli_json(*args: str) -> list[dict[str, Any]]:
    done = run_cli(*args, "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def check_study(url: str, name: str, n_trials: int) -> list[dict[str, Any]]:
    """Budget met, each trial recorded once, each layout measured to completion once."""
    engine = create_engine(url)
    with engine.connect() as c:
        sid = c.execute(text("select study_id from studies where study_name = :n"),
                        {"n": name}).scalar_one()
        states = dict(c.execute(text("select state, count(*) from trials where study_id = :s "
                                     "group by state"), {"s": sid}).all())
        rows = [dict(r._mapping) for r in c.execute(text(
            "select trial_id, layout_key, outcome, worker from measurements "
            "where study_name = :n"), {"n": name})]
        claims = c.execute(text("select count(*) from layout_claims where study_name = :n"),
                           {"n": name}).scalar_one()
    engine.dispose()
    assert "RUNNING" not in states, states
    assert claims == n_trials
    trial_ids = [r["trial_id"] for r in rows]
    assert len(trial_ids) == len(set(trial_ids)), "a trial was recorded twice"
    complete = [r["layout_key"] for r in rows if r["outcome"] == "complete"]
    assert len(complete) == len(set(complete)), "a layout was measured twice"
    judged = {r["layout_key"] for r in rows if r["outcome"] != "interrupted"}
    assert len(judged) == n_trials, rows
    return rows


def test_two_studies_two_workers_reach_their_budgets(tmp_path: Path, pg_url: str,
                                                     unique: str, slurm: None) -> None:
    names = [f"ci-{unique}-a", f"ci-{unique}-b"]
    path = write_campaign(tmp_path, pg_url, names, workers=2, max_continuations=1,
                          n_trials=2)
    rows = cli_json("campaign", "submit", str(path))
    assert [r["action"] for r in rows] == ["submitted", "submitted"]
    jobs = [j for r in rows for j in r["jobs"]]
    assert len(jobs) == 4  # per study: the worker array and one continuation
    # Submitting again while they are queued or running duplicates nothing.
    again = cli_json("campaign", "submit", str(path))
    assert all(r["action"].startswith("skipped: jobs live") for r in again), again
    wait_for_jobs(jobs, timeout_s=240)
    for name in names:
        check_study(pg_url, name, 2)
    status = cli_json("campaign", "status", str(path))
    for st in status:
        assert st["claimed"] == st["target"] == 2
        assert st["best_value"] and st["best_value"] > 0
        assert all(s == ["COMPLETED"] * len(s) for s in st["jobs"].values()), st["jobs"]
    final = cli_json("campaign", "submit", str(path))
    assert [r["action"] for r in final] == ["skipped: budget met"] * 2


def test_sigterm_worker_is_continued_by_its_dependency_job(tmp_path: Path, pg_url: str,
                                                           unique: str, slurm: None) -> None:
    name = f"ci-{unique}-term"
    # One layout per launch: the worker must be stopped while it still has layouts to
    # measure after its first result (a batch records its results when its launch ends).
    path = write_campaign(tmp_path, pg_url, [name], workers=1, max_continuations=1,
                          n_trials=3, batch_size=1)
    rows = cli_json("campaign", "submit", str(path))
    first, cont = list(rows[0]["jobs"])
    engine = create_engine(pg_url)
    deadline = time.monotonic() + 120
    measured = 0
    while measured < 1 and time.monotonic() < deadline:  # let one trial finish first
        with engine.connect() as c:
            measured = c.execute(text("select count(*) from measurements "
                                      "where study_name = :n"), {"n": name}).scalar_one()
        time.sleep(1)
    engine.dispose()
    assert measured >= 1, "the first worker measured nothing in 120 s"
    # What --signal=B:TERM@120 does before the walltime: SIGTERM to the batch shell,
    # which is the exec'd `autotune run`.
    subprocess.run(["scancel", "--batch", "--signal=TERM", first], check=True)
    wait_for_jobs([first, cont], timeout_s=240)
    rows_db = check_study(pg_url, name, 3)
    workers = {r["worker"] for r in rows_db}
    assert len(workers) >= 2, f"the continuation measured nothing: {rows_db}"
    log = "".join(p.read_text() for p in (tmp_path / "campaign.campaign" / "logs").glob(
        f"{name}-{first}_*.out"))
    assert "SIGTERM" in log, log[-2000:]
    states = cli_json("campaign", "status", str(path))[0]["jobs"]
    assert states[first] == ["COMPLETED"] and states[cont] == ["COMPLETED"], states
