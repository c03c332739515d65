"""Degenerate numbers from a trial (issue 23, D and E), real runs through ``autotune run``.

Each case is reproduced as the issue found it: the program (a stand-in, no torch) writes
the number, torchrun starts it as a rank, the runner reads it back; one layout (micro-batch)
per case, so that one study holds them all. Each ends as an ``error`` trial whose reason
names the field and the value: no runner crash (no traceback; exit 1 with "no trial
completed", as documented), no trial RUNNING, never COMPLETE, no best layout; and a rerun
measures nothing again (the budget is reached).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from tests.helpers import REPO, run_cli, write_study

pytestmark = [pytest.mark.slow, pytest.mark.faults]

# By micro-batch: the result file the trainer "wrote" (the builtin workload).
RESULTS = {
    1: {"status": "ok", "model_tflops_per_device": "fast"},
    2: {"status": "ok", "model_tflops_per_device": float("inf")},
    4: {"status": "ok", "model_tflops_per_device": 3.0, "step_times_s": [0.1, float("nan")]},
}
EXPECTED_RESULTS = {1: "result.model_tflops_per_device: got 'fast'",
                    2: "result.model_tflops_per_device: got inf",
                    4: "result.step_times_s[1]: got nan"}

# A "python" for launcher.local.python: torchrun runs it as ``PY -m trainer --spec S
# --result R``; it writes the layout's RESULTS entry to R (json.dumps writes Infinity, NaN).
_FAKE_PYTHON = """#!{python}
import json, sys
results = {results!r}
args = sys.argv[1:]
spec = json.load(open(args[args.index("--spec") + 1]))
with open(args[args.index("--result") + 1], "w") as fh:
    fh.write(results[str(spec["layout"]["micro_batch"])])
"""

# A command workload: 4 steps reported as the inputs were, by micro-batch.
_PROGRAM = """
import json, os, sys
how = sys.argv[1]
for step in range(1, 5):
    if how == "1":
        with open(os.environ["AUTOTUNE_METRICS_FILE"], "a") as fh:
            fh.write(json.dumps({"step": step, "seconds": 1e-300}) + "\\n")
    else:
        print(f" iteration {step:8d}/       4 | elapsed time per iteration (ms): 0.0 |",
              flush=True)
"""
EXPECTED_READBACK = {1: "result.model_tflops_per_device: got 2.2",  # 2.2e295: finite
                     2: "step_times_s[0] (step 2, from megatron-deepspeedai): got 0.0"}


def _run_twice(path: Path, n: int) -> dict[int, FrozenTrial]:
    env = {"PYTHONPATH": str(REPO)}
    for _ in range(2):  # the rerun finds the budget reached and measures nothing
        done = run_cli("run", str(path), env=env, timeout=300)
        out = done.stdout + done.stderr
        # Documented: exit 1 when no trial completed (cli.py), not a crash.
        assert done.returncode == 1 and "no trial completed" in done.stderr, out
        assert "Traceback" not in out, out
    url = f"sqlite:///{path.parent / 'study.db'}"
    trials = optuna.load_study(study_name="d", storage=url).get_trials()
    # No COMPLETE trial: ``status`` and ``best`` name no best layout (E).
    assert len(trials) == n and all(t.state == TrialState.FAIL for t in trials), trials
    return {t.user_attrs["layout_dict"]["micro_batch"]: t for t in trials}


def _search(micro_batches: list[int]) -> dict[str, object]:
    return {"tp": [1], "pp": [1], "micro_batch": micro_batches, "zero_stage": [0],
            "recompute": ["none"], "strategy": "cost-model-only",
            "n_trials": len(micro_batches)}


def test_a_degenerate_result_file_is_an_error_naming_the_field(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_PYTHON.format(
        python=sys.executable, results={str(k): json.dumps(v) for k, v in RESULTS.items()}))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    path = write_study(tmp_path / "d.yaml", name="d", devices=1, search=_search([1, 2, 4]),
                       launcher={"kind": "local", "run_dir": str(tmp_path / "runs"),
                                 "local": {"python": str(fake)}})
    by_mb = _run_twice(path, 3)
    for mb, expected in EXPECTED_RESULTS.items():
        assert by_mb[mb].user_attrs["outcome"] == "error"
        assert expected in by_mb[mb].user_attrs["reason"], by_mb[mb].user_attrs["reason"]


def test_a_degenerate_read_back_is_an_error_naming_the_field(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(_PROGRAM)
    workload = {"kind": "command", "argv": [sys.executable, str(program), "{micro_batch}"],
                "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}}
    path = write_study(tmp_path / "d.yaml", name="d", devices=1, search=_search([1, 2]),
                       trial={"warmup_steps": 1, "measure_steps": 3, "timeout_s": 120,
                              "device": "cpu"}, workload=workload)
    by_mb = _run_twice(path, 2)
    for mb, expected in EXPECTED_READBACK.items():
        assert by_mb[mb].user_attrs["outcome"] == "error"
        assert expected in by_mb[mb].user_attrs["reason"], by_mb[mb].user_attrs["reason"]
