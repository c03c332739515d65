"""SLURM host lists (``gpu[01-02,07],login1``) in Python: the one reader.

The SLURM launcher uses it where ``scontrol show hostnames`` is not installed
(:func:`autotune.launchers.slurm.expand_hostlist`), and the trainer to find its rendezvous
host, the first node of ``SLURM_STEP_NODELIST``, without calling ``scontrol`` on every
rank. Pure and light: both import it.

>>> parse_hostlist("gpu[01-02,07],login1,r[1-2]n[3-4]")
['gpu01', 'gpu02', 'gpu07', 'login1', 'r1n3', 'r1n4', 'r2n3', 'r2n4']
"""

from __future__ import annotations

import re

from autotune.errors import LaunchError

__all__ = ["parse_hostlist"]


def parse_hostlist(hostlist: str) -> list[str]:
    """SLURM's host-list syntax: comma-separated names, each with bracketed lists of
    numbers and ranges (zero padding kept; several brackets multiply out). A bracket that
    is not numbers is a :class:`~autotune.errors.LaunchError` naming the list."""
    entries, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            entries.append(hostlist[start:i].strip())
            start = i + 1
    hosts: list[str] = []
    for entry in filter(None, entries):
        names = [""]
        for text, spec in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", entry):
            suffixes = [text]
            if spec:
                suffixes = [text + n for n in _bracket_numbers(spec, hostlist)]
            names = [n + sfx for n in names for sfx in suffixes]
        hosts.extend(names)
    return hosts


def _bracket_numbers(spec: str, hostlist: str) -> list[str]:
    out = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise LaunchError(f"cannot read the SLURM host list {hostlist!r} ([{spec}])")
        width = len(lo)
        out += [str(n).zfill(width) for n in range(int(lo), int(hi or lo) + 1)]
    return out
