"""Launchers: where trials run. All share the contract in :mod:`autotune.launchers.base`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.launchers.base import Launcher

if TYPE_CHECKING:
    from autotune.config.cluster import ClusterConfig
    from autotune.config.launcher import LauncherConfig
    from autotune.config.model import ModelConfig
    from autotune.config.study import TrainingConfig
    from autotune.config.workload import WorkloadConfig

__all__ = ["Launcher", "make_launcher", "make_launchers"]


def make_launcher(launcher: LauncherConfig, model: ModelConfig, cluster: ClusterConfig,
                  training: TrainingConfig, *, source: str | None = None,
                  workload: WorkloadConfig | None = None) -> Launcher:
    """The launcher the study file's ``launcher`` section asks for (heavy backends imported
    only when used), running the study's ``workload`` (default: the built-in trainer).
    SLURM reads the node size from ``cluster``; a replayed table is matched against the
    study's model, cluster and global batch, with relative paths read from beside
    ``source`` (the study file), and answers for any workload."""
    from autotune.workloads import make_workload

    if launcher.kind == "local":
        from autotune.launchers.local import LocalLauncher

        local = LocalLauncher(launcher.local)
        local.workload = make_workload(workload, cluster)
        return local
    if launcher.kind == "slurm":
        from autotune.launchers.slurm import SlurmLauncher

        slurm = SlurmLauncher.for_study(launcher.slurm, cluster)
        slurm.workload = make_workload(workload, cluster)
        return slurm
    from autotune.launchers.replay import ReplayLauncher

    assert launcher.replay is not None  # LauncherConfig requires it for kind "replay"
    return ReplayLauncher.for_study(launcher.replay, model, cluster, training, source=source)


def make_launchers(launcher: LauncherConfig, model: ModelConfig, cluster: ClusterConfig,
                   training: TrainingConfig, *, source: str | None = None,
                   workload: WorkloadConfig | None = None) -> list[Launcher]:
    """The launchers one worker drives: one, or, for SLURM inside an allocation that holds
    the study's node count several times over, one per disjoint node group, so that
    independent trials run side by side (``autotune.runner.study.run_study`` gives each its own
    thread)."""
    if launcher.kind == "slurm":
        from autotune.launchers.slurm import SlurmLauncher, node_groups

        groups = node_groups(cluster.nodes)
        if len(groups) > 1:
            from autotune.workloads import make_workload

            launchers: list[Launcher] = []
            for g in groups:
                one = SlurmLauncher(launcher.slurm, devices_per_node=cluster.devices_per_node,
                                    nodelist=g)
                one.workload = make_workload(workload, cluster)
                launchers.append(one)
            return launchers
    return [make_launcher(launcher, model, cluster, training, source=source,
                          workload=workload)]
