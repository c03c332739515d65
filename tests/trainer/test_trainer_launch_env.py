"""Launcher environment parsing: torchrun, SLURM (with host-list expansion), PMI/PALS."""

from __future__ import annotations

import pytest

from trainer.distributed import DEFAULT_MASTER_PORT, launch_env_from


def test_torchrun_variables() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
           "MASTER_PORT": "1234", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    le = launch_env_from(env)
    # torchrun wins over an enclosing SLURM allocation (torchrun inside sbatch).
    assert (le.launcher, le.rank, le.world_size, le.local_rank) == ("torchrun", 3, 8, 1)
    assert (le.master_addr, le.master_port) == ("n1", 1234)


def test_slurm_variables_and_default_port() -> None:
    env = {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
           "SLURM_NODELIST": "x1000c0s[3-4]b0n0,login"}
    le = launch_env_from(env)
    assert (le.launcher, le.rank, le.world_size, le.local_rank) == ("slurm", 9, 16, 1)
    assert le.master_addr == "x1000c0s3b0n0"
    assert le.master_port == DEFAULT_MASTER_PORT


def test_slurm_master_from_env_wins() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "a[1-2]",
           "MASTER_ADDR": "head", "MASTER_PORT": "4000"}
    le = launch_env_from(env)
    assert (le.master_addr, le.master_port) == ("head", 4000)


@pytest.mark.parametrize("nodelist, head", [
    ("node01", "node01"), ("node[07-09,11]", "node07"), ("gpu[007-008]-ib,cpu1", "gpu007-ib"),
    ("r[1-2]n[3-4]", "r1n3"),
])
def test_the_rendezvous_host_is_the_first_of_the_step_nodelist(nodelist: str,
                                                                head: str) -> None:
    """The trainer reads the host list with the launcher's one reader (autotune.util.hostlist;
    its cases: tests/launchers/test_hostlist.py)."""
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": nodelist}
    assert launch_env_from(env).master_addr == head


@pytest.mark.parametrize("local_key", ["PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"])
def test_pmi_pals_variables(local_key: str) -> None:
    env = {"PMI_RANK": "13", "PMI_SIZE": "24", local_key: "1", "MASTER_ADDR": "x4000"}
    le = launch_env_from(env)
    assert (le.launcher, le.rank, le.world_size, le.local_rank) == ("pmi", 13, 24, 1)
    assert (le.master_addr, le.master_port) == ("x4000", DEFAULT_MASTER_PORT)


def test_no_launcher_is_a_single_rank() -> None:
    le = launch_env_from({})
    assert (le.launcher, le.rank, le.world_size, le.local_rank) == ("none", 0, 1, 0)
    assert le.master_port > 0


def test_bad_integer_names_the_variable() -> None:
    from autotune.errors import LaunchError

    with pytest.raises(LaunchError, match="SLURM_PROCID"):
        launch_env_from({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"})
