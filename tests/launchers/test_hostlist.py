"""SLURM host lists: the one Python reader (the launcher's where ``scontrol`` is absent, and
the trainer's for its rendezvous host) against scontrol."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from autotune.errors import LaunchError
from autotune.util.hostlist import parse_hostlist

CASES = ["node[01-04]", "a,b", "gpu[01-02,07],login1", "r[1-2]n[3-4]", "x[8-11]", "solo",
         "a[8-10],b[1,3]"]
"""Host lists scontrol expands. A suffix after a bracket (``gpu[007-008]-ib``) is read by the
Python reader but refused by Debian's scontrol 22.05 ("Invalid hostlist"), so it is tested
against its expected expansion only."""


def test_the_python_reader_expands_ranges_lists_padding_and_products() -> None:
    assert parse_hostlist("node[01-04]") == ["node01", "node02", "node03", "node04"]
    assert parse_hostlist("gpu[01-02,07],login1") == ["gpu01", "gpu02", "gpu07", "login1"]
    assert parse_hostlist("r[1-2]n[3-4]") == ["r1n3", "r1n4", "r2n3", "r2n4"]
    assert parse_hostlist("x[8-11]") == ["x8", "x9", "x10", "x11"]
    # the cases the trainer's own reader had (it now uses this one)
    assert parse_hostlist("node01") == ["node01"]
    assert parse_hostlist("node[01-03,07]") == ["node01", "node02", "node03", "node07"]
    assert parse_hostlist("a[8-10],b[1,3]") == ["a8", "a9", "a10", "b1", "b3"]
    assert parse_hostlist("gpu[007-008]-ib,cpu1") == ["gpu007-ib", "gpu008-ib", "cpu1"]
    with pytest.raises(LaunchError, match="cannot read the SLURM host list"):
        parse_hostlist("node[a-b]")


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol is not installed")
@pytest.mark.parametrize("hostlist", CASES)
def test_the_python_reader_agrees_with_scontrol(hostlist: str) -> None:
    out = subprocess.run(["scontrol", "show", "hostnames", hostlist], capture_output=True,
                         text=True, check=True, timeout=30).stdout.split()
    assert parse_hostlist(hostlist) == out
