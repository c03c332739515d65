"""Which DeepSpeed a study's trials run: read from the environment the workload runs in.

The built-in trainer runs in the launcher's interpreter (``launcher.local.python``, else
this one) with autotune's own environment; a user's program runs under
``workload.python`` (or the launcher's) with ``workload.env`` on top of ours, so its
``PYTHONPATH`` may put another DeepSpeed first (the test-only Megatron environment does).
The version is read from the package metadata in a child interpreter (no ``import
deepspeed``: that takes seconds), once per interpreter and path, and only for a study
whose space holds a layout that depends on it (MiCS): :func:`deepspeed_for_study`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from autotune.config.launcher import LauncherConfig
from autotune.config.study import SearchConfig
from autotune.config.workload import WorkloadConfig
from autotune.feasibility.strategies import DeepSpeedRuntime

__all__ = ["deepspeed_for_study", "deepspeed_in"]

_PROBE = ("import importlib.metadata as m\n"
          "try:\n    print(m.version('deepspeed'))\n"
          "except m.PackageNotFoundError:\n    print('')\n")
_PYTHON_NAMES = ("python", "python3")


@functools.lru_cache(maxsize=16)
def deepspeed_in(python: str, pythonpath: str | None) -> DeepSpeedRuntime:
    """The DeepSpeed ``python`` imports with ``PYTHONPATH=pythonpath`` (``None``: ours)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    where = f"{python}" + (f" with PYTHONPATH={pythonpath}" if pythonpath else "")
    try:
        done = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return DeepSpeedRuntime(None, f"{where}: {err}")
    version = done.stdout.strip() if done.returncode == 0 else ""
    return DeepSpeedRuntime(version or None, where)


def deepspeed_for_study(search: SearchConfig, workload: WorkloadConfig,
                        launcher: LauncherConfig) -> DeepSpeedRuntime | None:
    """The trials' DeepSpeed when the space has MiCS layouts (``None`` otherwise: nothing
    to check, and no child interpreter started). A replayed table is not checked: its rows
    say what ran."""
    if "mics" not in search.zero_variant or launcher.kind == "replay":
        return None
    launcher_python = launcher.local.python if launcher.kind == "local" else None
    env = {**launcher.local.env, **workload.env} if launcher.kind == "local" else workload.env
    if workload.kind == "builtin":
        trainer_python = launcher_python or sys.executable
        runtime = deepspeed_in(trainer_python, env.get("PYTHONPATH"))
        if launcher_python is None and "PYTHONPATH" not in env:
            return DeepSpeedRuntime(runtime.version, "the project environment, "
                                    f"{Path(trainer_python).name}")
        return runtime
    python = workload.python
    if python is None and workload.argv and Path(workload.argv[0]).name.startswith(
            _PYTHON_NAMES):
        python = workload.argv[0]
    return deepspeed_in(python or launcher_python or sys.executable,
                        env.get("PYTHONPATH", os.environ.get("PYTHONPATH")))
