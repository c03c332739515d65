"""``python -m autotune.workloads.rank_env -- CMD ARGS...``: run CMD with torchrun's variables.

srun starts one task per device but sets only its own variables; a program written for
``torchrun`` (Megatron-DeepSpeed reads ``RANK`` and ``WORLD_SIZE`` from the environment,
``torch.distributed`` ``env://`` needs ``MASTER_ADDR``/``MASTER_PORT``) would not find its
place in the job. This shim exports, as the built-in trainer derives them
(``trainer/distributed.py``):

* ``RANK`` = ``SLURM_PROCID``, ``WORLD_SIZE`` = ``SLURM_NTASKS``, ``LOCAL_RANK`` =
  ``SLURM_LOCALID``, ``LOCAL_WORLD_SIZE`` = the tasks on this node (PMI: ``PMI_RANK``,
  ``PMI_SIZE``, ``PALS_LOCAL_RANKID`` / ``PMI_LOCAL_RANK``);
* ``MASTER_ADDR``: kept if set, else the first node of ``SLURM_STEP_NODELIST`` (expanded by
  :func:`autotune.util.hostlist.parse_hostlist`); ``MASTER_PORT``: kept if set (the SLURM launcher
  sets a fresh one per step), else 29500;

and then replaces itself with CMD (``os.execvp``: no extra process to kill). Variables
already set (under torchrun) are left alone. Standard library and ``autotune.util.hostlist`` only.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, MutableMapping

from autotune.util.hostlist import parse_hostlist

__all__ = ["rank_variables", "main"]

DEFAULT_MASTER_PORT = "29500"


def _tasks_on_node(env: Mapping[str, str]) -> str | None:
    """``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``4(x2)`` or ``4,3``): this
    node's count, taken as the first (srun --ntasks-per-node makes them equal)."""
    raw = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    m = re.match(r"\d+", raw)
    return m.group(0) if m else None


def rank_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The torchrun-style variables for a process started with ``env`` (empty when it
    already has them or no launcher said anything).

    >>> v = rank_variables({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
    ...                     "SLURM_STEP_NODELIST": "gpu[07-08]", "MASTER_PORT": "23456",
    ...                     "SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
    >>> [v[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    ...                 "MASTER_ADDR", "MASTER_PORT")]
    ['5', '8', '1', '4', 'gpu07', '23456']
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        return {}
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = env["SLURM_PROCID"], env["SLURM_NTASKS"]
        local = env.get("SLURM_LOCALID", "0")
        per_node = _tasks_on_node(env)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or ""
        host = parse_hostlist(nodelist)[0] if nodelist else "127.0.0.1"
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
        rank, world = env["PMI_RANK"], env["PMI_SIZE"]
        local = env.get("PALS_LOCAL_RANKID", env.get("PMI_LOCAL_RANK", "0"))
        per_node = env.get("PALS_LOCAL_SIZE") or env.get("MPI_LOCALNRANKS")
        host = "127.0.0.1"
    else:
        return {}
    out = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local,
           "MASTER_ADDR": env.get("MASTER_ADDR") or host,
           "MASTER_PORT": env.get("MASTER_PORT") or DEFAULT_MASTER_PORT}
    if per_node:
        out["LOCAL_WORLD_SIZE"] = per_node
    return out


def main(argv: list[str] | None = None, env: MutableMapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m autotune.workloads.rank_env -- CMD [ARGS...]", file=sys.stderr)
        return 2
    env = os.environ if env is None else env
    env.update(rank_variables(env))
    try:
        os.execvpe(args[0], args, dict(env))
    except OSError as err:
        print(f"rank_env: cannot run {args[0]!r}: {err}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
