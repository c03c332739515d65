"""A foreign program under failure, real processes throughout:

* the example program driven out of memory by an address-space limit (``RLIMIT_AS``, the
  CPU's stand-in for a full device) is recorded ``oom``, infeasible, and its larger
  micro-batch sibling is never launched;
* a program that stops reporting steps is killed at ``workload.no_progress_s`` with all its
  processes (a child it started included), and the study goes on;
* a metrics file with garbage lines: the lines are skipped and counted, the trial completes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from autotune.launchers import make_launchers
from autotune.runner.study import run_study
from autotune.spec import load_study
from autotune.storage import open_storage
from tests.helpers import REPO, no_processes_mentioning, write_study
from tests.workloads.conftest import PROGRAMS

pytestmark = pytest.mark.slow

ONE_RANK = {"tp": [1], "pp": [1], "zero_stage": [0], "recompute": ["none"],
            "strategy": "cost-model-only"}


def _run(path: Path) -> tuple[list[optuna.trial.FrozenTrial], str]:
    spec = load_study(path)
    storage = open_storage(spec.storage)
    launchers = make_launchers(spec.launcher, spec.model, spec.cluster, spec.training,
                               source=spec.source, workload=spec.workload)
    run_study(spec, storage, launchers)
    return optuna.load_study(study_name=spec.name, storage=storage.optuna).get_trials(), \
        storage.url


def _launched(url: str, name: str) -> list[tuple[int, str]]:
    with create_engine(url).connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "select micro_batch, outcome from measurements where study_name = :n order by id"),
            {"n": name})]


def test_out_of_memory_is_infeasible_and_its_larger_sibling_is_not_launched(
        tmp_path: Path, deepspeed_cpu_ops: None) -> None:
    # Measured on this example (VmPeak above what the imports map, 64k vocabulary, one
    # layer): micro-batch 1 needs about 330 MiB, 16 about 1 GiB, 64 about 3.3 GiB. A 1500 MiB
    # budget leaves micro-batch 1 more than 1 GiB of room for the threads and arenas another
    # machine maps (500 MiB left it 170 MiB: it ran out in CI), and micro-batch 64 short by
    # more than 1.5 GiB, so the verdict does not hang on a machine's libraries.
    argv = [sys.executable, str(PROGRAMS / "limit_as.py"), "--budget-mb", "1500", "--",
            "examples/deepspeed_gpt/train.py", "--micro-batch-size", "{micro_batch}",
            "--grad-accum", "{grad_accum}", "--zero-stage", "{zero_stage}",
            "--steps", "{train_iters}", "--layers", "1", "--hidden", "16", "--heads", "4",
            "--ffn", "64", "--seq-len", "64", "--vocab", "65536"]
    workload = {"kind": "command", "argv": argv, "no_progress_s": 120,
                "env": {"DS_ACCELERATOR": "cpu", "MALLOC_ARENA_MAX": "2",
                        "OMP_NUM_THREADS": "1"}}
    model = {"n_layer": 1, "hidden": 16, "n_head": 4, "ffn_hidden": 64, "seq_len": 64,
             "vocab_size": 65536, "name": "big-vocab"}
    sections = {"model": model, "training": {"global_batch": 128, "dtype": "fp32"},
                # Exactly the 2 timed steps, not the precision's 6-12: micro-batch 1 runs
                # 128 accumulation steps each, and only its outcome is checked here.
                "trial": {"warmup_steps": 1, "measure_steps": 2, "timeout_s": 300,
                          "device": "cpu", "measure_precision": None}, "workload": workload}
    # First the micro-batch-64 layout runs out of memory ...
    first = write_study(tmp_path / "oom.yaml", name="oom", devices=1, n_trials=1,
                        search={**ONE_RANK, "micro_batch": [64], "n_trials": 1}, **sections)
    _run(first)
    # ... then the space grows: 128 needs no less memory than 64 and is never launched.
    second = write_study(tmp_path / "oom.yaml", name="oom", devices=1, n_trials=2,
                         search={**ONE_RANK, "micro_batch": [1, 64, 128], "n_trials": 2},
                         **sections)
    trials, url = _run(second)
    assert _launched(url, "oom") == [(64, "oom"), (1, "complete")]
    by_mb = {t.user_attrs["layout_dict"]["micro_batch"]: t for t in trials}
    oom = by_mb[64]
    assert oom.state == TrialState.PRUNED and oom.system_attrs["constraints:feasible"] == 1.0
    assert "Cannot allocate memory" in oom.user_attrs["reason"]
    if 128 in by_mb:  # proposed and refused (the strategy may skip it itself)
        assert by_mb[128].user_attrs["outcome"] == "infeasible"
        assert "ran out of memory" in by_mb[128].user_attrs["reason"]
    assert by_mb[1].state == TrialState.COMPLETE


def test_a_stalled_program_is_killed_with_its_processes_and_the_study_goes_on(
        tmp_path: Path) -> None:
    # Micro-batch 2 stops after two steps (and starts a child that hangs); micro-batch 1
    # runs through, writing 5 garbage lines into the metrics file after each step.
    argv = [sys.executable, str(PROGRAMS / "fake_trainer.py"), "--steps", "{train_iters}",
            "--micro-batch", "{micro_batch}", "--stall-if-micro-batch", "2", "--garbage", "5",
            "--marker", "{trial_dir}"]
    workload = {"kind": "command", "argv": argv, "no_progress_s": 3, "startup_s": 60,
                "env": {"PYTHONPATH": str(REPO)}}
    path = write_study(tmp_path / "stall.yaml", name="stall", devices=1, n_trials=2,
                       search={**ONE_RANK, "micro_batch": [1, 2], "n_trials": 2},
                       trial={"warmup_steps": 1, "measure_steps": 3, "timeout_s": 120,
                              "device": "cpu", "measure_precision": None},  # 4 steps run
                       workload=workload)
    started = time.monotonic()
    trials, _ = _run(path)
    assert time.monotonic() - started < 100  # well before the trial timeout of 120 s
    by_mb = {t.user_attrs["layout_dict"]["micro_batch"]: t for t in trials}
    stalled, fine = by_mb[2], by_mb[1]
    assert stalled.state == TrialState.FAIL and stalled.user_attrs["outcome"] == "timeout"
    assert "no new step after step 2" in stalled.user_attrs["reason"]
    assert "killed with all its processes" in stalled.user_attrs["reason"]
    launch = json.loads((Path(stalled.user_attrs["trial_dir"]) / "launch.json").read_text())
    assert launch["no_progress"] and not launch["timed_out"]
    assert no_processes_mentioning(str(tmp_path / "runs")) == []  # torchrun, rank and child
    assert fine.state == TrialState.COMPLETE
    result = json.loads((Path(fine.user_attrs["trial_dir"]) / "result.json").read_text())
    assert result["readback"] == {"source": "metrics-file", "steps": 4, "dropped": 1,
                                  "measured": 3, "garbage_lines": 20}
    assert len(result["step_times_s"]) == 3
