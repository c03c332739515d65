"""The SLURM launcher: the shared launcher contract on a real allocation, plus SLURM-only
checks (a step cancelled from outside, the step geometry, running outside an allocation)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from autotune.config.launcher import SlurmOptions
from autotune.errors import LaunchError
from autotune.launchers.slurm import SlurmLauncher, allocation_job_id, step_name
from autotune.layout import Layout
from autotune.sites import load_site
from autotune.trial import TrialPaths
from autotune.trial.classify import classify
from tests.helpers import processes_mentioning, tiny_spec
from tests.launchers.contract import LauncherContract


@pytest.mark.slurm
@pytest.mark.slow
class TestSlurmLauncher(LauncherContract):
    @pytest.fixture
    def launcher(self, allocation: str, monkeypatch: pytest.MonkeyPatch) -> SlurmLauncher:
        monkeypatch.setenv("SLURM_JOB_ID", allocation)
        return SlurmLauncher(SlurmOptions(site="local-ci"), devices_per_node=4)

    def test_step_cancelled_from_outside_is_interrupted(self, launcher: SlurmLauncher,
                                                        tmp_path: Path) -> None:
        paths = TrialPaths(tmp_path / "scancel")
        box: dict[str, object] = {}
        thread = threading.Thread(target=lambda: box.update(
            r=launcher.run(self.spec(test_hook="hang"), paths, timeout_s=300)))
        thread.start()
        name, step = step_name(paths), None
        deadline = time.monotonic() + 30
        while step is None and time.monotonic() < deadline:
            out = subprocess.run(["squeue", "--steps", "-h", "-o", "%i|%j"], text=True,
                                 capture_output=True).stdout
            step = next((ln.split("|")[0] for ln in out.splitlines()
                         if ln.endswith("|" + name)), None)
            time.sleep(0.5)
        assert step, "the trial's job step never showed up in squeue --steps"
        time.sleep(2)
        subprocess.run(["scancel", step], check=True)
        thread.join(timeout=60)
        report = box["r"]
        assert report.scheduler_state and report.scheduler_state.startswith("CANCELLED")
        outcome = classify(report)
        assert outcome.kind == "interrupted" and outcome.retry
        assert report.hosts
        time.sleep(1)
        assert processes_mentioning(str(paths.root)) == []


def test_outside_an_allocation_is_a_clear_error() -> None:
    with pytest.raises(LaunchError, match="SLURM_JOB_ID is not set"):
        allocation_job_id({})
    with pytest.raises(LaunchError, match="inside an allocation"):
        SlurmLauncher(env={})


def test_step_command_geometry(tmp_path: Path) -> None:
    launcher = SlurmLauncher(SlurmOptions(gpus_per_node="gpu:4", extra_args=("--mpi=none",)),
                             devices_per_node=4, site=load_site("generic-cuda"),
                             nodelist=["n1", "n2"], env={"SLURM_JOB_ID": "42"})
    spec = tiny_spec(Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=1))
    paths = TrialPaths(tmp_path / "s$(x)" / "trial-00001-k;ey")
    cmd = launcher.command(spec, paths, timeout_s=61)
    assert cmd[0] == "srun"
    for opt in ("--jobid=42", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--exact",
                "--kill-on-bad-exit=1", "--time=2", "--gres=gpu:4", "--cpus-per-task=8",
                "--nodelist=n1,n2", "--overlap", "--gpu-bind=closest", "--mpi=none"):
        assert opt in cmd, opt
    name = next(a for a in cmd if a.startswith("--job-name="))
    assert name == "--job-name=at-s-x--trial-00001-k-ey"  # plain characters only
    assert cmd[-6:-4] == ["-m", "trainer"]
    env = launcher.step_env(spec)
    assert env["MASTER_ADDR"] == "n1" and 20000 <= int(env["MASTER_PORT"]) <= 32000
    assert env["NCCL_ASYNC_ERROR_HANDLING"] == "1"  # from the site profile


def test_pbs_site_is_refused() -> None:
    with pytest.raises(Exception, match="not SLURM"):
        SlurmLauncher(SlurmOptions(site="aurora"), env={"SLURM_JOB_ID": "1"})


def test_a_failed_step_on_a_down_node_reads_node_fail(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """sacct says RESIZING for a step killed with its node (SLURM 22.05, --no-kill); the
    node's sinfo state is the reason. Fake sacct/sinfo answers, the real parsing."""
    import autotune.launchers.slurm as slurm_mod

    answers = {"sacct": "7.3|RESIZING|mn[3-4]\n",
               "sinfo": "mn3|mixed|none\nmn4|down*|Not responding\n"}
    monkeypatch.setattr(slurm_mod, "_slurm", lambda cmd: answers[cmd[0]])
    monkeypatch.setattr("autotune.launchers.slurm_commands._slurm", lambda cmd: answers[cmd[0]])
    monkeypatch.setattr(slurm_mod, "expand_hostlist", lambda s: ["mn3", "mn4"])
    launcher = SlurmLauncher(devices_per_node=2, env={"SLURM_JOB_ID": "7"})
    proc = subprocess.Popen(["false"])
    proc.wait()
    step = slurm_mod._Step(proc=proc, job_id="7", name="x", paths=TrialPaths(tmp_path),
                           step_id="7.3")
    state, hosts = launcher._finish(step)
    assert hosts == ["mn3", "mn4"]
    assert state == "NODE_FAIL mn4: down* (Not responding) (sacct step state RESIZING)"
    answers["sinfo"] = "mn3|mixed|none\nmn4|idle|none\n"
    answers["sacct"] = "7.3|FAILED|mn[3-4]\n"
    assert launcher._finish(step)[0] == "FAILED"  # healthy nodes: an ordinary failure
