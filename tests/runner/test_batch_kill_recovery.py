"""Issue 23 (F): a runner SIGKILLed in the middle of a batch, after 2 of its 4 members wrote
their result, loses neither: the next run records those 2 results (on the retries' trials,
from the killed trials' directories) and launches only the 2 unfinished members.

The trainer is a stand-in (``launcher.local.python``; torchrun starts it as the rank, as
the built-in trainer): it writes each member's result in turn and, while the test holds it,
stops after the second, so that the kill falls exactly there.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers import REPO, run_cli, write_study

pytestmark = [pytest.mark.slow, pytest.mark.faults]

_FAKE_TRAINER = """#!{python}
import json, os, sys, time
args = sys.argv[1:]  # -m trainer [options] --spec S --result R ...
specs = [args[i + 1] for i, a in enumerate(args) if a == "--spec"]
pairs = list(zip(specs, [args[i + 1] for i, a in enumerate(args) if a == "--result"]))
for index, (spec_path, result_path) in enumerate(pairs):
    layout = json.load(open(spec_path))["layout"]
    with open({launched!r}, "a") as fh:
        fh.write(json.dumps(layout) + "\\n")
    if index == 2 and os.path.exists({hold!r}):
        time.sleep(120)  # killed long before: the runner's death ends the launch
    result = {{"status": "ok", "model_tflops_per_device": float(layout["micro_batch"]),
              "step_time_s": 0.1, "step_times_s": [0.1, 0.1], "layout": layout,
              "batch_index": index, "batch_size": len(pairs), "elapsed_s": 0.5}}
    tmp = result_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh)
    os.replace(tmp, result_path)
"""


def _pids_mentioning(text: str) -> list[int]:
    """This test's own leftovers: live processes whose command line holds ``text``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and text in cmd and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids


def _results(runs: Path) -> set[Path]:
    return {p.parent for p in runs.glob("*/trial-*/result.json")}


def test_a_killed_batch_re_runs_only_its_unfinished_members(tmp_path: Path) -> None:
    runs, launched, hold = tmp_path / "runs", tmp_path / "launched.jsonl", tmp_path / "hold"
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_TRAINER.format(python=sys.executable, launched=str(launched),
                                         hold=str(hold)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    search = {"tp": [1], "pp": [1], "micro_batch": [1, 2, 4, 8], "zero_stage": [0],
              "recompute": ["none"], "strategy": "cost-model-only", "n_trials": 4}
    path = write_study(tmp_path / "b.yaml", name="b", devices=1, search=search,
                       trial={"warmup_steps": 1, "measure_steps": 2, "timeout_s": 300,
                              "device": "cpu", "batch_size": 4},
                       launcher={"kind": "local", "run_dir": str(runs),
                                 "local": {"python": str(fake)}})
    hold.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runner = subprocess.Popen([sys.executable, "-m", "autotune", "run", str(path)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(_results(runs)) < 2:
        assert runner.poll() is None and time.monotonic() < deadline, "no 2 results"
        time.sleep(0.05)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    finished = _results(runs)
    hold.unlink()
    for pid in _pids_mentioning(str(runs)):  # what the launch left (torchrun, the rank)
        os.kill(pid, signal.SIGKILL)
    assert len(finished) == 2
    first = [json.loads(x)["micro_batch"] for x in launched.read_text().splitlines()]
    assert len(first) == 3  # members 1 and 2 finished, the 3rd held when the kill came
    launched.write_text("")

    done = run_cli("run", str(path), env={"PYTHONPATH": str(REPO)}, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out
    assert out.count("not measured again") == 2, out
    again = sorted(json.loads(x)["micro_batch"] for x in launched.read_text().splitlines())
    finished_mb = {int(p.name.split("-mb")[1].split("-")[0]) for p in finished}
    assert again == sorted({1, 2, 4, 8} - finished_mb), (again, finished_mb)

    trials = optuna.load_study(study_name="b", storage=f"sqlite:///{tmp_path / 'study.db'}"
                               ).get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert sorted(t.user_attrs["layout_dict"]["micro_batch"] for t in complete) == [1, 2, 4, 8]
    recovered = [t for t in complete if "recovered_from" in (t.user_attrs.get("batch") or {})]
    assert {Path(t.user_attrs["trial_dir"]) for t in recovered} == finished
    assert all(t.value == t.user_attrs["layout_dict"]["micro_batch"] for t in complete)
