"""``tests/xdist_groups.py``: under ``pytest -n 2 --dist loadgroup`` (scripts/test.sh) the
SLURM tests run on one worker, the Megatron ones on one worker, and each module's other
tests on one worker, whatever modules they are in; an ``alone`` test has nothing beside it.

A CI run with pytest-xdist's own ``loadgroup`` (which pytest 9 ignores) ran two
``multinode`` tests at once, and one killed the other's node. Here a small tree of tests
records which worker ran each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.helpers import REPO

pytest.importorskip("xdist")

_CONFTEST = """
from tests import xdist_groups

def pytest_configure(config):
    config.pluginmanager.register(xdist_groups, "autotune-xdist-groups")
"""
_INI = """[pytest]
markers =
    slurm: a SLURM test
    multinode: a multi-node SLURM test
    megatron: a Megatron test
    alone: a test with nothing beside it
"""
_RECORD = """
import os, time, pytest

def _ran(name):
    start = time.monotonic()
    time.sleep(0.2)  # long enough for the workers' tests to overlap unless kept apart
    with open(os.environ["RAN"], "a") as fh:
        fh.write(f"{__name__}::{name} {os.environ['PYTEST_XDIST_WORKER']} {start} "
                 f"{time.monotonic()}\\n")
"""


def _module(tests: dict[str, str]) -> str:
    """A test module: test name -> its decorator ('' for none)."""
    body = [_RECORD]
    for name, mark in tests.items():
        body += [mark, f"def {name}():", f"    _ran({name!r})", ""]
    return "\n".join(body)


def test_services_share_one_worker_and_modules_stay_whole(tmp_path: Path) -> None:
    tree = {
        "test_a.py": {"test_a_slurm": "@pytest.mark.slurm", "test_a_plain": "",
                      "test_a_megatron": "@pytest.mark.megatron"},
        "test_b.py": {"test_b_multinode": "@pytest.mark.multinode",
                      "test_b_plain": "", "test_b_plain2": ""},
        "test_c.py": {"test_c_megatron": "@pytest.mark.megatron",
                      "test_c_slurm": "@pytest.mark.slurm"},
        **{f"test_m{i}.py": {f"test_m{i}_{j}": "" for j in range(4)} for i in range(6)},
    }
    tree["test_m3.py"]["test_m3_alone"] = "@pytest.mark.alone"
    for name, tests in tree.items():
        (tmp_path / name).write_text(_module(tests))
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "pytest.ini").write_text(_INI)
    ran, scratch = tmp_path / "ran.txt", tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAN": str(ran), "TMPDIR": str(scratch)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", "--dist", "loadgroup", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in ran.read_text().splitlines()]
    worker = {name: w for name, w, _, _ in rows}
    assert len(worker) == sum(len(t) for t in tree.values())
    assert len(set(worker.values())) == 2  # both workers ran tests

    def workers(names: list[str]) -> set[str]:
        return {worker[n] for n in names}

    assert len(workers(["test_a::test_a_slurm", "test_b::test_b_multinode",
                        "test_c::test_c_slurm"])) == 1
    assert len(workers(["test_a::test_a_megatron", "test_c::test_c_megatron"])) == 1
    modules: dict[str, set[str]] = defaultdict(set)
    for name, w in worker.items():
        if not any(k in name for k in ("slurm", "multinode", "megatron")):
            modules[name.split("::")[0]].add(w)
    assert all(len(ws) == 1 for ws in modules.values()), modules
    # Nothing ran beside the alone test.
    _, alone_worker, start, end = next(r for r in rows if r[0] == "test_m3::test_m3_alone")
    beside = [r for r in rows if r[1] != alone_worker
              and float(r[2]) < float(end) and float(r[3]) > float(start)]
    assert not beside, (start, end, beside)
    assert not list(scratch.glob("autotune-xdist-groups-*"))  # the maps' folder is removed
