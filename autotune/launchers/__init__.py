"""Launchers: where trials run. All share the contract in :mod:`autotune.launchers.base`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.launchers.base import Launcher, LaunchReport, TrialPaths

if TYPE_CHECKING:
    from autotune.spec import StudySpec

__all__ = ["Launcher", "LaunchReport", "TrialPaths", "make_launcher"]


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

    return ReplayLauncher.for_study(spec)  # type: ignore[attr-defined]
