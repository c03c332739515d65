"""DeepSpeed's Autotuner (``deepspeed --autotuning tune``) for a run on this one machine.

Run as the ``deepspeed`` command is (``python benchmarks/_ds_autotuner_local.py
--autotuning tune --num_gpus 2 SCRIPT --deepspeed_config ds_config.json ...``): it calls
DeepSpeed's own launcher entry point (``deepspeed.launcher.runner.main``, which runs
``Autotuner.tune`` for ``--autotuning``) after two replacements in
``deepspeed/autotuning/scheduler.py`` (DeepSpeed 0.19.8):

* ``clean_up``: after each experiment the scheduler runs ``pdsh -f 1024 -w HOSTS pkill -f
  EXPERIMENT_NAME``. pdsh is not installed here, and a kill by name could hit another
  user's process on a shared machine. For a local run nothing is left to kill: the
  experiment's ``deepspeed`` launcher has been waited for (``result.wait()`` in
  ``run_experiment``) and it waits for its ranks. The replacement does nothing.
* ``run_experiment`` is wrapped to time each launch (wall seconds, start to end) and append
  one JSON line per launch to the file named by ``AUTOTUNE_BENCH_LAUNCHES``: the
  benchmark's launch count and device-seconds. The autotuner records neither.

The rest of what it takes (``LOCAL_SIZE``, ``tabulate``, a private
``TORCH_EXTENSIONS_DIR``) is environment, set by the caller
(``benchmarks/vs_deepspeed_autotuner.py``; docs/vs-deepspeed-autotuner.md lists each).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

LAUNCHES_ENV = "AUTOTUNE_BENCH_LAUNCHES"


def _no_clean_up(exp: dict[str, Any], reservations: Any) -> None:
    """The launch was waited for: nothing of it is left running (module docstring)."""


def patch_scheduler(launches_path: str | None) -> None:
    """Replace the scheduler's clean-up and time its launches (module docstring)."""
    from deepspeed.autotuning import scheduler

    original = scheduler.run_experiment

    def timed_run_experiment(exp: dict[str, Any], reservations: Any, user_script: str,
                             user_args: list[str]) -> None:
        start = time.time()
        try:
            original(exp, reservations, user_script, user_args)
        finally:
            if launches_path:
                record = {"name": exp.get("name"), "start": start,
                          "wall_s": time.time() - start,
                          "ranks": int(exp.get("num_gpus", 1)) * int(exp.get("num_nodes", 1))}
                with open(launches_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")

    scheduler.clean_up = _no_clean_up
    scheduler.run_experiment = timed_run_experiment


def main() -> None:
    patch_scheduler(os.environ.get(LAUNCHES_ENV))
    from deepspeed.launcher.runner import main as deepspeed_main

    deepspeed_main(sys.argv[1:])


if __name__ == "__main__":
    main()
