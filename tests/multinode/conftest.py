"""The multi-node SLURM cluster of ``.ci/cluster.sh`` (4 nodes, one network namespace each),
or a visible skip (a failure under ``CI=true``).

Tests select the cluster with ``SLURM_CONF`` (its own conf, beside the single-node cluster
of ``.ci/services.sh``, which stays the default for every other test) and take allocations
with :func:`salloc`. A test that uses ``mn_cluster`` must carry ``@pytest.mark.multinode``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import unavailable

MN_ENV_FILE = Path(os.environ.get("AUTOTUNE_MN_ENV", "/tmp/autotune-mn/env"))
REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = ".ci/cluster.sh"


@dataclass(frozen=True)
class MnCluster:
    conf: str
    """Its ``slurm.conf``: set ``SLURM_CONF`` to it to talk to this cluster."""
    nodes: int
    pg_url: str
    """PostgreSQL server URL (no database) as a batch job inside a node's namespace reaches it."""

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a SLURM command aimed at this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**env, "SLURM_CONF": self.conf, **extra}

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              check=False, env=self.env())

    def idle_nodes(self) -> list[str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
        return [ln.split()[0] for ln in out if ln.strip().endswith("idle")]

    def restore(self, timeout_s: float = 60) -> None:
        """Every node back (a test killed one): restart its slurmd, wait until all idle."""
        subprocess.run(["bash", str(REPO / CLUSTER_SH), "start"], capture_output=True,
                       text=True, timeout=120, check=False)
        deadline = time.monotonic() + timeout_s
        while len(self.idle_nodes()) < self.nodes and time.monotonic() < deadline:
            time.sleep(0.5)


def _read_env() -> dict[str, str]:
    out: dict[str, str] = {}
    if MN_ENV_FILE.is_file():
        for line in MN_ENV_FILE.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                key, _, value = line[len("export "):].partition("=")
                out[key.strip()] = value.strip()
    return out


@pytest.fixture(scope="session")
def mn_cluster() -> MnCluster:
    """The 4-node cluster, every node idle (``bash .ci/cluster.sh`` brings it up)."""
    env = _read_env()
    conf = env.get("AUTOTUNE_MN_SLURM_CONF")
    if shutil.which("sinfo") is None:
        unavailable("multi-node SLURM", "sinfo is not installed", CLUSTER_SH)
    if not conf or not Path(conf).is_file():
        unavailable("multi-node SLURM", f"no cluster env in {MN_ENV_FILE}", CLUSTER_SH)
    cluster = MnCluster(conf=conf, nodes=int(env.get("AUTOTUNE_MN_NODES", "4")),
                        pg_url=env.get("AUTOTUNE_MN_PG_URL", ""))
    try:
        if len(cluster.idle_nodes()) < cluster.nodes:
            cluster.restore()
        idle = cluster.idle_nodes()
    except subprocess.TimeoutExpired:
        unavailable("multi-node SLURM", "sinfo timed out", CLUSTER_SH)
    if len(idle) < cluster.nodes:
        unavailable("multi-node SLURM", f"{len(idle)} of {cluster.nodes} nodes idle: "
                    + cluster.run("sinfo", "-N").stdout, CLUSTER_SH)
    return cluster


@contextmanager
def salloc(cluster: MnCluster, nodes: int, *, per_node: int = 2, no_kill: bool = False,
           minutes: int = 10) -> Iterator[dict[str, str]]:
    """An allocation of ``nodes`` nodes (``salloc --no-shell``), as the environment a
    process inside it would see (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ...)."""
    args = ["salloc", "--no-shell", f"-N{nodes}", f"--ntasks-per-node={per_node}",
            "-t", str(minutes), "-J", "autotune-mn-tests"] + (["--no-kill"] if no_kill else [])
    done = cluster.run(*args, timeout=120)
    job = next((w for w in done.stderr.split() if w.isdigit()), None)
    if done.returncode != 0 or job is None:
        pytest.fail(f"salloc failed: {done.stderr.strip()}")
    try:
        nodelist = cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
        yield cluster.env(SLURM_JOB_ID=job, SLURM_JOBID=job, SLURM_JOB_NODELIST=nodelist,
                          SLURM_NODELIST=nodelist, SLURM_JOB_NUM_NODES=str(nodes),
                          SLURM_NTASKS_PER_NODE=str(per_node))
    finally:
        cluster.run("scancel", job)
