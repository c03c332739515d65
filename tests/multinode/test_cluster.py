"""The namespace cluster itself: 4 nodes with 4 names and 4 addresses, and a TP group that
would cross nodes refused by the one check (the rule the 2-node studies rely on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.layout import Layout
from autotune.spec import load_study
from tests.helpers import REPO
from tests.multinode.conftest import MnCluster


@pytest.mark.multinode
def test_srun_on_every_node_sees_its_own_name_and_address(mn_cluster: MnCluster) -> None:
    done = mn_cluster.run("srun", f"-N{mn_cluster.nodes}", "--ntasks-per-node=1", "-t", "1",
                          "sh", "-c", "echo $(hostname) $(hostname -I)")
    assert done.returncode == 0, done.stderr
    rows = sorted(tuple(line.split()[:2]) for line in done.stdout.splitlines())
    names, addrs = {r[0] for r in rows}, {r[1] for r in rows}
    assert len(rows) == mn_cluster.nodes and len(names) == mn_cluster.nodes, rows
    assert len(addrs) == mn_cluster.nodes and all(a.startswith("10.77.0.") for a in addrs)


def test_the_smoke_study_refuses_tp_across_nodes(tmp_path: Path) -> None:
    spec = load_study(REPO / "studies" / "multinode_smoke.yaml")
    from autotune.feasibility import Constraints

    cons = Constraints.from_configs(spec.cluster, spec.training, spec.search, spec.trial)
    tp4 = Layout(tp=4, pp=1, dp=1, micro_batch=2, grad_accum=4)
    assert [r.code for r in cons.check(tp4, spec.model)] == ["tp_cross_node"]
    inside = Layout(tp=2, pp=2, dp=1, micro_batch=2, grad_accum=4)
    assert cons.check(inside, spec.model) == []
