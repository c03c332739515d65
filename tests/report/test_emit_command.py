"""``best --emit command`` prints the production line (issue #24): the user's own step
count (``workload.production_train_iters``, else ``{train_iters}`` left to fill, never a
trial's short run), the launcher's line with the layout's geometry, the environment first."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.layout import Layout
from autotune.report.export import emit_best
from autotune.storage.keys import StudyAttr
from autotune.storage.study_records import workload_record

MODEL = {"n_layer": 2, "hidden": 64, "n_head": 4, "ffn_hidden": 256, "seq_len": 64,
         "vocab_size": 256}
ARGV = ["python", "train.py", "--mb", "{micro_batch}", "--steps", "{train_iters}",
        "--ds", "{ds_config}"]


def _emit(tmp_path: Path, layout: Layout, *, launcher: dict[str, Any], per_node: int,
          **workload: Any) -> list[str]:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.FINGERPRINT, {"model": MODEL, "dtype": "fp32"})
    study.set_user_attr(StudyAttr.WORKLOAD, workload_record(
        {"kind": "command", "argv": ARGV, "outer": "per-device", "env": {"K": "v w"},
         **workload}, train_iters=13, ranks_per_node=per_node, launcher=launcher))
    study.add_trial(optuna.trial.create_trial(value=0.5))
    return emit_best(study, layout, study.trials[0], fmt="command", out_dir=tmp_path
                     ).splitlines()


LAY = Layout(tp=1, pp=2, dp=4, micro_batch=2, grad_accum=1)


def test_local_line_is_torchrun_with_the_layouts_ranks_and_the_users_step_count(
        tmp_path: Path) -> None:
    lines = _emit(tmp_path, LAY, launcher={"kind": "local", "env": {"OMP_NUM_THREADS": "4"}},
                  per_node=8, production_train_iters=5000)
    words = shlex.split(lines[-1])
    assert words[:2] == ["OMP_NUM_THREADS=4", "K=v w"]
    assert words[2:7] == ["torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=8",
                          "--no-python"]
    program = words[7:]
    assert program[:4] == ["python", "train.py", "--mb", "2"]
    assert program[program.index("--steps") + 1] == "5000"  # not the trial's 13
    assert not any("fill in" in line for line in lines)


def test_without_a_production_count_the_placeholder_is_left_to_fill(tmp_path: Path) -> None:
    lines = _emit(tmp_path, LAY, launcher={"kind": "local"}, per_node=8)
    program = shlex.split(lines[-1])
    assert program[program.index("--steps") + 1] == "{train_iters}"
    assert any("fill in {train_iters}" in line for line in lines[:-1])


def test_multi_node_local_line_rendezvous_at_the_first_node(tmp_path: Path) -> None:
    lines = _emit(tmp_path, LAY, launcher={"kind": "local"}, per_node=4)
    assert '"--rdzv-endpoint=$MASTER_ADDR:29500"' in lines[-1]
    assert "--nnodes=2 --nproc-per-node=4" in lines[-1]


def test_slurm_line_is_srun_with_the_steps_geometry_and_rank_variables(
        tmp_path: Path) -> None:
    lines = _emit(tmp_path, LAY, per_node=4, production_train_iters=100, launcher={
        "kind": "slurm", "env": {}, "gpus_per_node": "gpu:4", "cpus_per_task": 8,
        "extra_args": ["--account=x"]})
    words = shlex.split(lines[-1])
    assert words[1:9] == ["srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4",
                          "--gres=gpu:4", "--cpus-per-task=8", "--account=x", "python"]
    assert words[9:12] == ["-m", "autotune.workloads.rank_env", "--"]
    assert words[12:14] == ["python", "train.py"]


@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_a_command_that_launches_its_own_ranks_is_printed_as_it_is(
        tmp_path: Path, kind: str) -> None:
    lines = _emit(tmp_path, LAY, launcher={"kind": kind}, per_node=4, outer="none")
    words = shlex.split(lines[-1])[1:]
    if kind == "slurm":
        assert words[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
        words = words[4:]
    assert words[:2] == ["python", "train.py"]


def test_the_study_records_its_launcher_for_the_line(tmp_path: Path) -> None:
    from autotune.config.launcher import LauncherConfig
    from autotune.runner.optuna_io import launcher_record

    record = launcher_record(LauncherConfig.from_dict({"kind": "slurm", "slurm": {
        "gpus_per_node": "gpu:4", "env": {"A": "b"}, "extra_args": ["--account=x"]}}))
    lines = _emit(tmp_path, LAY, launcher=record, per_node=4)
    words = shlex.split(lines[-1])
    assert words[:6] == ["A=b", "K=v w", "srun", "--nodes=2", "--ntasks=8",
                         "--ntasks-per-node=4"]
    assert "--gres=gpu:4" in words and "--account=x" in words
