"""A group replayed by the study runner itself: what ``autotune run`` does with the replay
study file a user would write for it.

* :func:`replay_spec`: that study file (the group's model, cluster and global batch, the
  strategy, seed and budget, every other setting at the shipped default, SQLite and the
  run folder in a working folder, ``launcher.replay.study_check``).
* :func:`study_run`: :func:`autotune.runner.study.run_study` on it, in this process, with
  the replay launcher: the trials it launched (:class:`StudyTrial`), in order, with what
  each cost in device-seconds.
* :func:`replay_device_seconds`: what a replayed trial of each layout costs, counted as
  :func:`study_run` counts it, for the replays that do not go through the runner
  (``benchmarks/_common.py``, ``replay``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.landscape import LandscapeGroup
from autotune.layout import Layout

__all__ = ["StudyTrial", "replay_device_seconds", "replay_spec", "study_run"]


@dataclass(frozen=True)
class StudyTrial:
    """One trial the runner launched in a replayed study, in launch order."""

    layout: Layout
    status: str
    """``ok``, ``oom`` or ``error`` (as :class:`~autotune.search.Observation`)."""
    value: float | None
    device_seconds: float
    """What it cost: the seconds of its timing breakdown (``timings_s``: a failed build
    for an OOM, :func:`autotune.launchers.replay.replay_timings`) times its devices."""


def replay_spec(group: LandscapeGroup, strategy: str, *, seed: int, n_trials: int,
                workdir: str, study_check: bool = True,
                memory_margin: float | None = None, name: str = "replay",
                build_s: float | None = None) -> Any:
    """The study file a user would write to replay ``group`` with ``autotune run``: the
    group's model, cluster and global batch, ``search.strategy``/``seed``/``n_trials``,
    every other setting at the shipped default, a SQLite database and run folder under
    ``workdir``, and ``launcher.replay.study_check`` (the memory check on by default)."""
    from autotune.config.launcher import LauncherConfig, ReplayOptions
    from autotune.config.study import StorageConfig
    from autotune.spec import StudySpec

    trial = TrialConfig() if memory_margin is None else TrialConfig(memory_margin=memory_margin)
    return StudySpec(
        name=name, model=group.model, cluster=group.cluster,
        training=TrainingConfig(group.global_batch, group.dtype, group.stack),
        search=SearchConfig(strategy=strategy, seed=seed, n_trials=n_trials), trial=trial,
        storage=StorageConfig(url=f"sqlite:///{workdir}/study.db"),
        launcher=LauncherConfig(kind="replay", run_dir=f"{workdir}/runs",
                                replay=ReplayOptions(
                                    landscape=group.name, study_check=study_check,
                                    build_s=ReplayOptions.build_s if build_s is None
                                    else build_s)))


def study_run(group: LandscapeGroup, strategy: str, *, seed: int, n_trials: int | None = None,
              study_check: bool = True, memory_margin: float | None = None,
              build_s: float | None = None) -> list[StudyTrial]:
    """``group`` replayed by the study runner itself (:func:`autotune.runner.study.
    run_study`, the replay launcher, the spec of :func:`replay_spec`, SQLite in a temporary
    folder, in this process): the trials it launched, in order, until ``n_trials`` (default:
    every row) or until it stopped. What ``autotune run`` does with that study file."""
    import tempfile

    from autotune.launchers.replay import ReplayLauncher
    from autotune.runner.study import run_study
    from autotune.storage import Storage, TrialAttr, trial_layout, trial_outcome

    n = n_trials or len(group.measurements)
    with tempfile.TemporaryDirectory(prefix="autotune-replay-") as workdir:
        spec = replay_spec(group, strategy, seed=seed, n_trials=n, workdir=workdir,
                           study_check=study_check, memory_margin=memory_margin,
                           build_s=build_s)
        launcher = ReplayLauncher(group, build_s=spec.launcher.replay.build_s)
        storage = Storage(spec.storage)
        try:
            summary = run_study(spec, storage, launcher)
        finally:
            storage.close()
    out = []
    for t in sorted(summary.trials, key=lambda t: t.number):
        kind, layout = trial_outcome(t), trial_layout(t)
        if layout is None or kind not in ("complete", "oom", "error", "timeout", "stopped"):
            continue  # refused (infeasible, dominated by an OOM) or skipped: not launched
        timings = t.user_attrs.get(TrialAttr.TIMINGS_S) or {}
        seconds = sum(float(v) for v in timings.values())
        status = "ok" if kind in ("complete", "stopped") else ("oom" if kind == "oom"
                                                                else "error")
        out.append(StudyTrial(layout, status, t.value if status == "ok" else None,
                              seconds * layout.world_size))
    return out


def replay_device_seconds(group: LandscapeGroup, build_s: float | None = None
                          ) -> Callable[[Layout], float]:
    """What a replayed trial of each layout of ``group`` costs in device-seconds, as
    :func:`study_run` counts it (the replay launcher's timing breakdown at the shipped
    defaults): for the replays that do not go through the runner."""
    from autotune.launchers.replay import ReplayLauncher
    from autotune.spec import StudySpec

    spec = StudySpec(name="cost", model=group.model, cluster=group.cluster,
                     training=TrainingConfig(global_batch=group.global_batch,
                                             dtype=group.dtype))
    launcher = ReplayLauncher(group) if build_s is None else ReplayLauncher(group,
                                                                             build_s=build_s)
    run = spec.run_config()
    return lambda lay: (sum(launcher.result_for(lay, run).timings_s.values())
                        * lay.world_size)
