"""``best --emit slurm``: a ready job script for the production run of the best layout,
submitted to the CI's SLURM cluster (.ci/services.sh) where it runs the built-in trainer.

The study is tuned with a stand-in trainer (fast, see fake_trainer.py); the job runs the
real built-in trainer on the study's tiny model with the best layout and the user's step
count, and its rank 0 writes the result."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli, wait_for_jobs, write_study
from tests.newcomer.fake_trainer import fake_trainer


def _tuned(tmp_path: Path) -> Path:
    python, _ = fake_trainer(tmp_path)
    search = {"tp": [1], "pp": [1, 2], "micro_batch": [1, 2], "zero_stage": [0],
              "recompute": ["none"], "strategy": "cost-model-only", "n_trials": 3}
    path = write_study(tmp_path / "p.yaml", name="prod", devices=2, search=search,
                       trial={"warmup_steps": 1, "measure_steps": 2, "timeout_s": 120,
                              "device": "cpu", "batch_size": 3},
                       launcher={"kind": "local", "run_dir": str(tmp_path / "runs"),
                                 "local": {"python": str(python)}})
    done = run_cli("run", str(path), env={"PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr
    return path


@pytest.mark.slow
def test_the_script_names_nodes_tasks_time_site_and_steps(tmp_path: Path) -> None:
    study = _tuned(tmp_path)
    out = tmp_path / "job"
    done = run_cli("best", str(study), "--emit", "slurm", "--site", "local-ci", "--steps",
                   "7", "--time", "00:05:00", "--out", str(out),
                   env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr
    script = Path(done.stdout.strip())
    text = script.read_text()
    for line in ("#SBATCH --nodes=1", "#SBATCH --ntasks=2", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --time=00:05:00", "#SBATCH --partition=debug",
                 "export OMP_NUM_THREADS=1", "-m trainer --spec"):
        assert line in text, (line, text)
    spec = json.loads((out / "production_spec.json").read_text())
    assert spec["run"]["measure_steps"] == 7 and spec["run"]["warmup_steps"] == 0
    assert spec["layout"]["tp"] * spec["layout"]["pp"] * spec["layout"]["dp"] == 2
    missing = run_cli("best", str(study), "--emit", "slurm", "--site", "local-ci",
                      env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert missing.returncode == 2 and "--steps N" in missing.stderr
    pbs = run_cli("best", str(study), "--emit", "slurm", "--site", "aurora", "--steps", "1",
                  env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert pbs.returncode == 2 and "not SLURM" in pbs.stderr


@pytest.mark.slurm
@pytest.mark.slow
def test_the_script_runs_on_the_ci_cluster(tmp_path: Path, slurm: None) -> None:
    study = _tuned(tmp_path)
    out = tmp_path / "job"
    done = run_cli("best", str(study), "--emit", "slurm", "--site", "local-ci", "--steps",
                   "2", "--time", "00:10:00", "--out", str(out),
                   env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr
    script = Path(done.stdout.strip())
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                               text=True, timeout=60, cwd=tmp_path,
                               env={**_env(), "PYTHONPATH": str(REPO)})
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wait_for_jobs([job], timeout_s=540)
    logs = "\n".join(p.read_text() for p in out.glob("train-prod-*.out"))
    result = json.loads((out / "production_result.json").read_text())
    assert result["status"] == "ok", (result, logs)
    assert result["world_size"] == 2 and len(result["losses"]) == 2, result


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_a_program_of_ones_own_runs_under_srun_with_the_site_environment(
        tmp_path: Path) -> None:
    import optuna

    from autotune.layout import Layout
    from autotune.report.job_script import JobOptions, render_job
    from autotune.sites import load_site
    from autotune.storage.keys import StudyAttr
    from autotune.storage.study_records import workload_record

    study = optuna.create_study(direction="maximize", study_name="own")
    study.set_user_attr(StudyAttr.FINGERPRINT, {"model": {
        "n_layer": 2, "hidden": 64, "n_head": 4, "ffn_hidden": 256, "seq_len": 64,
        "vocab_size": 256}, "dtype": "bf16"})
    argv = ["python", "train.py", "--steps", "{train_iters}", "--ds", "{ds_config}"]
    study.set_user_attr(StudyAttr.WORKLOAD, workload_record(
        {"kind": "command", "argv": argv, "outer": "per-device"}, train_iters=13,
        ranks_per_node=4, launcher={"kind": "slurm", "site": "generic-cuda", "env": {}}))
    lay = Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=4)
    text = render_job(study, lay, options=JobOptions(steps=500), out_dir=tmp_path)
    site = load_site("generic-cuda")
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks=8" in text
    assert "#SBATCH --ntasks-per-node=4" in text
    for key in site.env:
        assert f"export {key}=" in text
    if site.modules:
        assert "module load " in text
    srun = text.strip().splitlines()[-1]
    assert srun.startswith("srun --nodes=2 --ntasks=8 --ntasks-per-node=4")
    assert "autotune.workloads.rank_env" in srun and "--steps 500" in srun
    assert (tmp_path / "ds_config.json").is_file()
