"""Worker start-up (issue 23): a worker imports what its role needs. A replay study and the
runner's side of a trial of the built-in trainer import neither torch nor DeepSpeed (the
trainer's ranks do, in their own processes), nor the reports' pandas and matplotlib.
``python -X importtime -m autotune run STUDY`` shows the rest (benchmarks/many_workers.py
reports what the start-up costs 64 workers)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, write_study
from tests.replay_study import write_replay_study

HEAVY = ("torch", "deepspeed", "pandas", "matplotlib")

# Runs the study in this interpreter, then lists the heavy packages it imported.
_RUN = f"""
import json, sys
from autotune.cli import main
code = main(["run", sys.argv[1], "--quiet"])
print(json.dumps({{"code": code, "heavy": sorted(m for m in sys.modules
                                              if m.split(".")[0] in {HEAVY!r})}}))
"""

# A "python" for launcher.local.python that writes an ok result (no torch anywhere).
_FAKE_TRAINER = """#!{python}
import json, sys
args = sys.argv[1:]
with open(args[args.index("--result") + 1], "w") as fh:
    json.dump({{"status": "ok", "model_tflops_per_device": 1.0}}, fh)
"""


def _imported(study: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _RUN, str(study)], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["code"] == 0, done.stderr[-3000:]
    return list(out["heavy"])


def test_a_replay_worker_imports_no_torch_deepspeed_or_reports(tmp_path: Path) -> None:
    study = write_replay_study(tmp_path, name="imports", url=f"sqlite:///{tmp_path}/s.db",
                               n_trials=3)
    assert _imported(study) == []


@pytest.mark.slow
def test_the_runner_side_of_a_builtin_trial_imports_no_torch(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_TRAINER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    study = write_study(tmp_path / "b.yaml", name="b", devices=1, n_trials=1,
                        search={"tp": [1], "pp": [1], "micro_batch": [1], "zero_stage": [0],
                                "recompute": ["none"], "strategy": "cost-model-only",
                                "n_trials": 1},
                        launcher={"kind": "local", "run_dir": str(tmp_path / "runs"),
                                  "local": {"python": str(fake)}})
    assert _imported(study) == []
