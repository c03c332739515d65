"""autotune's own trainer started as a ``command`` workload (through its CLI, reporting in
the metrics file like any user program) and as the ``builtin`` workload, on the same layout
in one run: the same model TFLOPS per device within measurement noise. The figure is
printed (``-s``).

Two checks: the score the command workload reads back is exactly the one the trainer computes
of the same steps (its own result file, written beside: same steps, same formula), and the
two runs agree within the run-to-run noise of this shared machine."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.launchers import make_launchers
from autotune.runner.study import run_study
from autotune.spec import load_study
from autotune.storage import open_storage
from tests.helpers import REPO, write_study

pytestmark = pytest.mark.slow

MODEL = {"n_layer": 2, "hidden": 256, "n_head": 4, "seq_len": 128, "vocab_size": 512,
         "ffn_hidden": 1024, "name": "sbs"}
SEARCH = {"tp": [1], "pp": [1], "micro_batch": [4], "zero_stage": [0], "recompute": ["none"],
          "n_trials": 1, "strategy": "cost-model-only"}
# Exactly 7 timed steps each (no adaptive stop): the trainer started as a command must
# reach its own result file, which autotune's stop would cut short.
TRIAL = {"warmup_steps": 2, "measure_steps": 7, "timeout_s": 300, "device": "cpu",
         "measure_precision": None}
TRAINER_AS_COMMAND = {
    "kind": "command",
    "argv": [sys.executable, "-m", "trainer", "--spec", "{trial_dir}/spec.json",
             "--result", "{trial_dir}/trainer-result.json"],
    "env": {"PYTHONPATH": str(REPO)}, "no_progress_s": 120}


def _measure(tmp_path: Path, name: str, **sections: object) -> optuna.trial.FrozenTrial:
    path = write_study(tmp_path / f"{name}.yaml", name=name, devices=1, model=MODEL,
                       training={"global_batch": 8, "dtype": "fp32"}, search=SEARCH,
                       trial=TRIAL, **sections)
    spec = load_study(path)
    storage = open_storage(spec.storage)
    launchers = make_launchers(spec.launcher, spec.model, spec.cluster, spec.training,
                               source=spec.source, workload=spec.workload)
    run_study(spec, storage, launchers)
    (trial,) = optuna.load_study(study_name=name, storage=storage.optuna).get_trials()
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("reason")
    return trial


@pytest.mark.alone  # compares the throughput of two launches
def test_trainer_as_a_command_scores_as_the_builtin_workload(tmp_path: Path) -> None:
    builtin = _measure(tmp_path, "sbs-builtin")
    command = _measure(tmp_path, "sbs-command", workload=TRAINER_AS_COMMAND)
    assert builtin.user_attrs["layout"] == command.user_attrs["layout"]
    assert command.user_attrs["launcher"] == "local"
    own = json.loads((Path(command.user_attrs["trial_dir"]) / "trainer-result.json").read_text())
    assert command.value == pytest.approx(own["model_tflops_per_device"], rel=1e-9)
    assert command.user_attrs["step_time_s"] == pytest.approx(own["step_time_s"], rel=1e-9)
    ratio = command.value / builtin.value
    noise = max(t.user_attrs["step_time_iqr_s"] / t.user_attrs["step_time_s"]
                for t in (builtin, command))
    print(f"\nmodel TFLOPS/device: builtin {builtin.value:.5f}, trainer as command "
          f"{command.value:.5f}, ratio {ratio:.3f}; step-time IQR/median up to {noise:.3f}")
    # Two runs a minute apart on two cores shared with other work: between two runs of one
    # layout this machine shows up to ~30%; a workload that scored differently (another
    # FLOPs count, the world size wrong) would be off by 2x or more.
    assert 0.65 < ratio < 1 / 0.65
    assert statistics.median([builtin.value, command.value]) > 0
