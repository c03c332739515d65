"""Running a scaling study: each size's study in turn, smallest first, in one database.

Each size is an ordinary study (:func:`autotune.runner.study.run_study`) of the spec
:func:`~autotune.scaling.sizes.size_spec` derives, so everything a study does holds per
size: the budget counts what the database already has (a second run resumes; a size that
reached its budget is not measured again), a SIGTERM stops the run after the trial in
flight is recorded, its layout claims keep workers from measuring anything twice. A size
starts from what the smaller ones measured: the calibration's key is device type, dtype
and workload, not the world size (``docs/models.md``), so the earlier sizes' rows are its
warm start, and the line each size prints says which studies it learned from.

Each size's study carries the user attribute ``scaling``, ``{mode: record}``
(:func:`scaling_record`; one study may serve both modes), by which ``autotune status``
finds the scaling studies of a database and shows their tables.

A size with no feasible layout (a 175B GPT on one node: its states alone exceed the
devices' memory) is skipped, its reason logged and kept in :attr:`ScalingRun.skipped`, and
the run goes on with the next size; the table then shows it without a layout, and the
efficiency against the smallest size that has one. Only when every size is such does the
run stop, with the first one's error.
Under SLURM, run it inside an allocation of the largest size (``salloc -N 4 autotune
scaling ...``) or from a campaign job; the smaller sizes' trials run side by side on
disjoint node groups of the allocation, as any study's do.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.errors import EmptySpaceError
from autotune.planning.candidates import replayed_rows
from autotune.runner.lifecycle import StopSignals
from autotune.scaling.sizes import ScalingRequest, size_spec
from autotune.spec import StudySpec
from autotune.storage import StudyAttr
from autotune.trial.outcome import StopReason

__all__ = ["SCALING_ATTR", "scaling_record", "run_scaling", "ScalingRun"]

SCALING_ATTR = StudyAttr.SCALING
"""Study user attribute of a size's study (:func:`scaling_record`)."""


def scaling_record(spec: StudySpec, request: ScalingRequest, size: int) -> dict[str, Any]:
    """What ``autotune status`` needs to rebuild the table: the group, mode, axis, sizes,
    and the study file it came from."""
    from pathlib import Path

    return {"group": spec.name, "mode": request.mode, "axis": request.axis, "size": size,
            "sizes": list(request.sizes),
            "source": str(Path(spec.source).resolve()) if spec.source else None}


@dataclass
class ScalingRun:
    """How the run went: the sizes finished, and what stopped it (``None``: all done)."""

    done: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)
    """Sizes with no feasible layout, and why (module docstring)."""
    stopped_by: StopReason | None = None
    """``sigterm``, ``interrupt``, ``failed`` (a size completed no trial)."""
    stopped_at: int | None = None


def run_scaling(spec: StudySpec, request: ScalingRequest, *, n_trials: int | None,
                storage_url: str | None, log: Callable[[str], None],
                quiet: bool = False) -> ScalingRun:
    """Tune every size of ``request`` in order (module docstring)."""
    specs = [size_spec(spec, request, size) for size in request.sizes]  # all checked first
    for at in specs:  # a replayed table holds every size, before the first size runs
        replayed_rows(at)
    outcome = ScalingRun()
    # A SIGTERM between two sizes' studies (after one study's own StopSignals was removed,
    # before the next one's) stops the run before its next size, as one inside a study
    # does; the default action would kill the process there (exit -15, not the 0 that lets
    # a campaign resume). SIGINT keeps its default (KeyboardInterrupt: exit 130).
    with StopSignals([], signals=(signal.SIGTERM,)) as between:
        for size, at in zip(request.sizes, specs, strict=True):
            if between.received is not None:  # arrived while no size's study ran
                outcome.stopped_by, outcome.stopped_at = StopReason.SIGTERM, size
                return outcome
            try:
                going_on = _run_size(spec, request, size, at, outcome, n_trials=n_trials,
                                     storage_url=storage_url, log=log, quiet=quiet)
            except EmptySpaceError as err:
                # Known before any trial (the study creates nothing): a size too small
                # for the model says nothing about the sizes it fits.
                outcome.skipped[size] = str(err)
                log(f"{request.axis} {size}: skipped: {err}")
                if len(outcome.skipped) == len(request.sizes):
                    raise
                continue
            if not going_on:
                return outcome
    return outcome


def _run_size(spec: StudySpec, request: ScalingRequest, size: int, at: StudySpec,
              outcome: ScalingRun, *, n_trials: int | None, storage_url: str | None,
              log: Callable[[str], None], quiet: bool) -> bool:
    """One size's study; False when the scaling run stops at it (``outcome`` says why)."""
    import optuna

    from autotune.launchers import make_launchers
    from autotune.runner.progress import Progress, best_line
    from autotune.runner.study import run_study
    from autotune.storage import learned_from_line, learned_from_of, open_storage

    if storage_url:
        at = at.with_storage_url(storage_url)
    if n_trials:
        at = replace(at, search=replace(at.search, n_trials=n_trials))
    launchers = make_launchers(at.launcher, at.model, at.cluster, at.training,
                               source=at.source, workload=at.workload)
    storage = open_storage(at.storage, connections=len(launchers))
    try:
        log(f"{request.mode} scaling, {request.axis} {size}: study {at.name!r}, "
            f"{at.world_size} devices, global batch {at.training.global_batch}, "
            f"budget {at.search.n_trials} trials")
        summary = run_study(at, storage, launchers, n_trials=at.search.n_trials,
                            progress=Progress(total=at.search.n_trials,
                                              enabled=not quiet))
        study = optuna.load_study(study_name=at.name, storage=storage.optuna)
        records = dict(study.user_attrs.get(SCALING_ATTR) or {})
        records[request.mode] = scaling_record(spec, request, size)
        study.set_user_attr(SCALING_ATTR, records)
        learned = learned_from_line(learned_from_of(study))
        if learned:
            log(f"{request.axis} {size}: calibration carried over across world sizes: "
                f"{learned}")
        if summary.best is not None:
            log(f"{request.axis} {size}: {best_line(summary.best)}")
    finally:
        storage.close()
    if summary.stopped_by in (StopReason.SIGTERM, StopReason.INTERRUPT):
        outcome.stopped_by, outcome.stopped_at = summary.stopped_by, size
        return False
    if summary.best is None:
        outcome.stopped_by, outcome.stopped_at = StopReason.FAILED, size
        return False
    outcome.done.append(size)
    return True
