"""Adaptive measurement of a real user's program (issue #24): the shipped example
``examples/deepspeed_gpt/train.py``, plain DeepSpeed on 2 CPU ranks under torchrun, is
started with a cap of 200 timed steps and stopped by autotune once its median step time is
known to the precision asked; what it printed is the measurement."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.config.workload import WorkloadConfig
from autotune.launchers.local import LocalLauncher
from autotune.layout import Layout
from autotune.trial import RunConfig, TrialPaths, TrialSpec
from autotune.trial.classify import classify
from autotune.workloads.foreign import CommandWorkload
from tests.helpers import REPO, no_processes_mentioning

pytestmark = pytest.mark.slow

_PRINTED = re.compile(r"^step (\d+)/(\d+) \| time ([0-9.]+) s \| loss", re.M)
ARGV = ("python", "examples/deepspeed_gpt/train.py", "--deepspeed-config", "{ds_config}",
        "--micro-batch-size", "{micro_batch}", "--grad-accum", "{grad_accum}",
        "--zero-stage", "{zero_stage}", "--pipeline-stages", "{pp}", "--steps", "{train_iters}",
        "--layers", "2", "--hidden", "256", "--heads", "4", "--ffn", "1024", "--seq-len", "128",
        "--vocab", "256")
# Big enough that a step takes tens of milliseconds: the program must still be running
# when autotune has seen enough (a 4 ms step ran all 200 before the watcher's next poll).
MODEL = ModelConfig(n_layer=2, hidden=256, n_head=4, ffn_hidden=1024, seq_len=128,
                    vocab_size=256)
CAP = 200


def test_the_example_program_is_stopped_once_its_median_is_known(
        tmp_path: Path, deepspeed_cpu_ops: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the template's paths are the checkout's, as a user runs it
    # `python` in the template is the one on PATH: this interpreter's, as in its venv (CI runs
    # .venv/bin/python without activating the venv).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    workload = CommandWorkload(WorkloadConfig(kind="command", argv=ARGV, no_progress_s=120,
                                              env={"DS_ACCELERATOR": "cpu"}),
                               ClusterConfig(devices_per_node=2, device="cpu"))
    launcher = LocalLauncher()
    launcher.workload = workload
    # A loose precision (the interval's half-width within half the median) is reached from
    # 6 to 9 steady steps even on a loaded machine, well before the cap.
    spec = TrialSpec(model=MODEL, layout=Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=1),
                     run=RunConfig(device="cpu", warmup_steps=1, measure_steps=3,
                                   measure_precision=0.5, max_measure_steps=CAP))
    paths = TrialPaths(tmp_path / "trial")
    report = launcher.run(spec, paths, timeout_s=300)
    assert no_processes_mentioning(str(paths.root)) == []  # torchrun and both ranks
    stop = report.measured_stop
    assert stop is not None and stop["reason"] == "precision", report.stderr_tail
    assert classify(report).kind == "complete"
    printed = {int(m[1]): float(m[3]) for m in _PRINTED.finditer(paths.stdout.read_text())}
    assert {int(m[2]) for m in _PRINTED.finditer(paths.stdout.read_text())} == {1 + CAP}
    result = json.loads(paths.result.read_text())
    assert result["status"] == "ok" and result["readback"]["source"] == "metrics-file"
    n = result["readback"]["steps"]
    assert 1 + 6 <= n < 1 + CAP and max(printed) < 1 + CAP  # stopped: it never reached its end
    # The stored steps are the program's own timings (printed to 6 decimals), warm-up
    # dropped (a step printed just before the kill may not have reached the metrics file).
    assert result["step_times_s"] == pytest.approx([printed[k] for k in range(2, n + 1)],
                                                   abs=1e-6)
    assert result["measure_precision"] <= 0.5 and result["measurement_stop"]["steps"] >= 6
