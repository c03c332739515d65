"""Real trainer trials across the namespace nodes, through the SLURM launcher: one trial on
2 nodes, two side by side on disjoint node pairs of a 4-node allocation, and a node killed
under a running trial (its layout retried on the healthy pair, its node group dropped).

Each test runs ``autotune run`` inside an allocation as a user would (``salloc`` then
``autotune run`` in it), with a tiny model and short trials, and reads the study back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import create_engine, text

from tests.helpers import write_study
from tests.multinode.conftest import MnCluster, salloc

pytestmark = [pytest.mark.multinode, pytest.mark.slow]


def _study(tmp_path: Path, name: str, *, n_trials: int, tp: list[int], pp: list[int],
           micro_batch: list[int], measure_steps: int = 2, timeout_s: int = 120) -> Path:
    return write_study(
        tmp_path / f"{name}.yaml", name=name, n_trials=n_trials,
        cluster={"nodes": 2, "devices_per_node": 2, "device": "cpu"},
        search={"tp": tp, "pp": pp, "micro_batch": micro_batch, "zero_stage": [0],
                "recompute": ["none"], "n_trials": n_trials},
        trial={"warmup_steps": 1, "measure_steps": measure_steps, "timeout_s": timeout_s,
               "device": "cpu"},
        launcher={"kind": "slurm", "run_dir": str(tmp_path / "runs")})


def _autotune(path: Path, env: dict[str, str], **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "autotune", "run", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                            **popen)


def _trials(tmp_path: Path, name: str) -> list[FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study.db'}")
    return study.get_trials(deepcopy=False)


def _claims(tmp_path: Path, name: str) -> int:
    engine = create_engine(f"sqlite:///{tmp_path / 'study.db'}")
    with engine.connect() as c:
        n = c.execute(text("select count(*) from layout_claims where study_name = :n"),
                      {"n": name}).scalar_one()
    engine.dispose()
    return int(n)


def _launched(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if t.user_attrs.get("hosts")]


def test_a_trial_spans_two_nodes_with_tp_inside_and_pp_across(mn_cluster: MnCluster,
                                                              tmp_path: Path) -> None:
    path = _study(tmp_path, "mn-two", n_trials=1, tp=[2], pp=[2], micro_batch=[2])
    with salloc(mn_cluster, 2) as env:
        proc = _autotune(path, env)
        out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    (trial,) = _launched(_trials(tmp_path, "mn-two"))
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["layout"].startswith(
        "tp2-pp2-dp1")
    hosts = trial.user_attrs["hosts"]
    assert len(hosts) == 2 and all(h.startswith("mn") for h in hosts), hosts
    result = json.loads((Path(trial.user_attrs["trial_dir"]) / "result.json").read_text())
    ranks = result["rank_hosts"]
    # Rank order (pipe, data, model): ranks 0-1 are stage 0's TP pair, 2-3 stage 1's.
    assert ranks[0] == ranks[1] and ranks[2] == ranks[3] and ranks[0] != ranks[2], ranks
    assert sorted(set(ranks)) == sorted(hosts)


def test_two_trials_side_by_side_on_disjoint_node_pairs(mn_cluster: MnCluster,
                                                        tmp_path: Path) -> None:
    path = _study(tmp_path, "mn-pair", n_trials=2, tp=[2], pp=[1, 2], micro_batch=[2])
    with salloc(mn_cluster, 4) as env:
        t0 = time.monotonic()
        proc = _autotune(path, env)
        out, _ = proc.communicate(timeout=300)
        wall_s = time.monotonic() - t0
    assert proc.returncode == 0, out
    assert "2 trials side by side" in out
    trials = _trials(tmp_path, "mn-pair")
    done = _launched(trials)
    assert len(done) == 2 and all(t.state == TrialState.COMPLETE for t in done), out
    assert len({t.user_attrs["layout"] for t in done}) == 2
    assert {t.user_attrs["worker"].rsplit("/", 1)[1] for t in done} == {"0", "1"}
    a, b = (set(t.user_attrs["hosts"]) for t in done)
    assert len(a) == len(b) == 2 and not a & b, (a, b)
    first, second = sorted(done, key=lambda t: t.datetime_start)
    assert second.datetime_start < first.datetime_complete, "the trials did not overlap"
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert _claims(tmp_path, "mn-pair") == 2  # the budget, as with one worker
    each = ", ".join(f"{t.user_attrs['elapsed_s']:.1f}" for t in done)
    print(f"side by side: 2 trials in {wall_s:.1f} s wall ({each} s each)")


def _step_on(cluster: MnCluster, node: str, job: str, deadline_s: float) -> str | None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        out = cluster.run("squeue", "--steps", "-h", "-j", job, "-o", "%i|%N").stdout
        for line in out.splitlines():
            sid, _, nodes = line.partition("|")
            if node in cluster.run("scontrol", "show", "hostnames", nodes).stdout.split():
                return sid
        time.sleep(0.5)
    return None


def test_a_node_lost_mid_trial_is_retried_on_the_healthy_pair(mn_cluster: MnCluster,
                                                              tmp_path: Path) -> None:
    timeout_s = 120
    path = _study(tmp_path, "mn-loss", n_trials=2, tp=[2], pp=[1, 2], micro_batch=[1, 2],
                  measure_steps=30, timeout_s=timeout_s)
    try:
        with salloc(mn_cluster, 4, no_kill=True) as env:
            proc = _autotune(path, env)
            step = _step_on(mn_cluster, "mn4", env["SLURM_JOB_ID"], 90)
            assert step, "no trial step ever ran on mn4"
            time.sleep(3)  # the ranks are up and rendezvousing / training
            killed_at = datetime.now()
            subprocess.run(["bash", str(Path(__file__).parents[2] / ".ci/cluster.sh"),
                            "kill-node", "mn4"], check=True, capture_output=True)
            out, _ = proc.communicate(timeout=400)
    finally:
        mn_cluster.restore()
    assert proc.returncode == 0, out
    trials = _trials(tmp_path, "mn-loss")
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    (lost,) = [t for t in trials if t.user_attrs.get("outcome") == "node_failure"]
    assert lost.state == TrialState.FAIL and "mn4" in lost.user_attrs["hosts"]
    assert "NODE_FAIL" in lost.user_attrs["reason"] and "mn4" in lost.user_attrs["reason"]
    assert lost.datetime_complete is not None
    kill_to_recorded_s = (lost.datetime_complete - killed_at).total_seconds()
    assert kill_to_recorded_s < timeout_s
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 2 and len({t.user_attrs["layout"] for t in done}) == 2, out
    assert _claims(tmp_path, "mn-loss") == 2  # the retry took the lost trial's claim
    (retry,) = [t for t in done if t.user_attrs.get("retry_of") == lost.number]
    assert retry.user_attrs["layout"] == lost.user_attrs["layout"]
    assert set(retry.user_attrs["hosts"]).isdisjoint({"mn3", "mn4"})
    dead_worker = lost.user_attrs["worker"]
    assert [t.number for t in _launched(trials) if t.user_attrs["worker"] == dead_worker] \
        == [lost.number], "the worker of the dead node group ran another trial"
    print(f"node loss: kill -> recorded failure {kill_to_recorded_s:.1f} s "
          f"(reason: {lost.user_attrs['reason']})")
