"""``python limit_as.py --budget-mb N -- SCRIPT ARGS...``: run SCRIPT with little memory.

Imports what the example imports (torch, DeepSpeed) first, then limits the address space
(``RLIMIT_AS``) to what the process has mapped plus N MiB, and runs SCRIPT in this process
(``runpy``), so that the budget is the same on any machine whatever its libraries map.
An allocation beyond it fails as it would on a full machine: PyTorch's CPU allocator raises
``RuntimeError: DefaultCPUAllocator: can't allocate memory ... (Cannot allocate memory)``.
"""

from __future__ import annotations

import argparse
import os
import resource
import runpy
import sys

import deepspeed  # noqa: F401  (mapped before the limit, as the script would map it)
import torch  # noqa: F401


def _mapped_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget-mb", type=int, required=True)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    a = p.parse_args()
    rest = a.rest[1:] if a.rest and a.rest[0] == "--" else a.rest
    limit = _mapped_bytes() + a.budget_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.argv = rest
    sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
    runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
