"""Readers of what the runner stored import its records, never its loop or a launcher."""

from __future__ import annotations

import subprocess
import sys

READERS = ["autotune.report.results", "autotune.report.build", "autotune.report.crossstudy",
           "autotune.report.export", "autotune.campaign.jobs"]


def test_readers_load_no_loop_and_no_launcher() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in READERS)
            + "print(' '.join(sorted(m for m in sys.modules if m.startswith(("
              "'autotune.launchers', 'autotune.runner.study', 'autotune.runner.worker', "
              "'autotune.runner.optuna_io', "
              "'autotune.runner.lifecycle')))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == ""
