"""Launchers: where trials run. All share the contract in :mod:`autotune.launchers.base`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.launchers.base import Launcher, LaunchReport, TrialPaths

if TYPE_CHECKING:
    from autotune.spec import StudySpec

__all__ = ["Launcher", "LaunchReport", "TrialPaths", "make_launcher", "make_launchers"]


def make_launcher(spec: StudySpec) -> Launcher:
    """The launcher the study file asks for (heavy backends imported only when used)."""
    cfg = spec.launcher
    if cfg.kind == "local":
        from autotune.launchers.local import LocalLauncher

        return LocalLauncher(cfg.local)
    if cfg.kind == "slurm":
        from autotune.launchers.slurm import SlurmLauncher

        return SlurmLauncher.for_study(spec)
    from autotune.launchers.replay import ReplayLauncher

    return ReplayLauncher.for_study(spec)


def make_launchers(spec: StudySpec) -> list[Launcher]:
    """The launchers one worker drives: one, or, for SLURM inside an allocation that holds
    the study's node count several times over, one per disjoint node group, so that
    independent trials run side by side (``autotune.runner.study.run_study`` gives each its own
    thread)."""
    if spec.launcher.kind == "slurm":
        from autotune.launchers.slurm import SlurmLauncher, node_groups

        groups = node_groups(spec.cluster.nodes)
        if len(groups) > 1:
            return [SlurmLauncher(spec.launcher.slurm,
                                  devices_per_node=spec.cluster.devices_per_node, nodelist=g)
                    for g in groups]
    return [make_launcher(spec)]
