"""A campaign on the multi-node cluster: one worker array per study (2 studies), each job
2 nodes; the first study's worker gets the walltime SIGTERM mid-study and its dependency job
finishes it. PostgreSQL (a database of this test's own) records every trial once."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from tests.campaign.test_slurm import check_study, cli_json
from tests.helpers import REPO, wait_for_jobs
from tests.multinode.conftest import MnCluster

pytestmark = [pytest.mark.multinode, pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def mn_db(mn_cluster: MnCluster, pg_url: str, unique: str) -> Iterator[str]:
    """A fresh database, by the URL a batch job inside a node's namespace uses."""
    name = f"autotune_mn_{unique}"
    server = create_engine(f"{mn_cluster.pg_url}/postgres", isolation_level="AUTOCOMMIT")
    with server.connect() as c:
        c.execute(text(f'create database "{name}"'))
    try:
        yield f"{mn_cluster.pg_url}/{name}"
    finally:
        with server.connect() as c:
            c.execute(text(f'drop database if exists "{name}" with (force)'))
        server.dispose()


def test_two_study_campaign_of_two_node_jobs_survives_sigterm(
        mn_cluster: MnCluster, mn_db: str, unique: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in list(os.environ) if v.startswith("SLURM_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("SLURM_CONF", mn_cluster.conf)  # run_cli and squeue: this cluster
    study = yaml.safe_load((REPO / "studies" / "campaigns" / "ci-mn.yaml").read_text())
    # One layout per launch, as in tests/campaign/test_slurm.py's SIGTERM test: the SIGTERM
    # must fall between the first result and the next (a batch of both finished in one
    # launch before it arrived, and the continuation had nothing left to measure).
    study["trial"]["batch_size"] = 1
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    names = [f"mn-{unique}-a", f"mn-{unique}-b"]
    campaign = {
        "name": "mn", "storage": {"url": mn_db}, "site": "local-ci-mn",
        "slurm": {"time": "00:10:00", "workers": 1, "max_continuations": 1},
        "studies": [{"file": "study.yaml", "name": n, "overrides": {"search": {"seed": i}}}
                    for i, n in enumerate(names)],
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))
    rows = cli_json("campaign", "submit", str(path))
    assert [r["action"] for r in rows] == ["submitted", "submitted"]
    first, cont = list(rows[0]["jobs"])
    jobs = [j for r in rows for j in r["jobs"]]
    engine = create_engine(mn_db)
    deadline, measured = time.monotonic() + 150, 0
    while measured < 1 and time.monotonic() < deadline:  # one trial of study a first
        with engine.connect() as c:
            measured = c.execute(text("select count(*) from measurements "
                                      "where study_name = :n"), {"n": names[0]}).scalar_one()
        time.sleep(1)
    engine.dispose()
    assert measured >= 1, "study a's first worker measured nothing in 150 s"
    # Both studies' workers hold 2 nodes each at once: the 4-node cluster is full.
    nodes = mn_cluster.run("squeue", "-h", "-t", "R", "-o", "%i %D").stdout.split("\n")
    assert sum(int(ln.split()[1]) for ln in nodes if ln.strip()) <= mn_cluster.nodes
    mn_cluster.run("scancel", "--batch", "--signal=TERM", first)
    wait_for_jobs(jobs, timeout_s=300)
    engine = create_engine(mn_db)
    for name in names:
        check_study(mn_db, name, 2)
        with engine.connect() as c:
            hosts = [json.loads(h) for (h,) in c.execute(text(
                "select hosts from measurements where study_name = :n and outcome = "
                "'complete'"), {"n": name})]
        assert len(hosts) == 2 and all(len(set(h)) == 2 for h in hosts), hosts  # 2 nodes
    engine.dispose()
    rows_a = check_study(mn_db, names[0], 2)
    assert len({r["worker"] for r in rows_a}) >= 2, f"the continuation measured nothing: {rows_a}"
    log = "".join(p.read_text() for p in (tmp_path / "campaign.campaign" / "logs").glob(
        f"{names[0]}-{first}_*.out"))
    assert "SIGTERM" in log, log[-2000:]
    status = cli_json("campaign", "status", str(path))
    assert all(st["claimed"] == st["target"] == 2 for st in status), status
    states = status[0]["jobs"]
    assert states[first] == ["COMPLETED"] and states[cont] == ["COMPLETED"], states
