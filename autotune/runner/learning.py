"""What a study learns from measurements: the calibration's rows from the database, the
refit after each trial, and the calibrated constraints and candidates.

The maths is :mod:`autotune.models.calibration`'s; this module reads and applies it.

* The key of a study is its device type, dtype and workload (:func:`workload_of`: what
  ran, ``builtin``, ``command`` or ``megatron-deepspeed`` as the study's ``workload.kind``
  says, or ``replay`` for a replayed table): a study of the user's own program never
  calibrates, nor is calibrated by, studies of the built-in trainer.
* The warm start is one query at the start of a run (:func:`earlier_rows`): the ``ok``
  and ``oom`` rows of *other* studies of the key, only the columns calibration reads, the
  :data:`MAX_EARLIER_ROWS` most recent (``search.learn_from_database: false`` or
  ``--no-learn`` skip it).
* :class:`StudyLearning` is one worker's calibration. :meth:`~StudyLearning.refit` reads
  the study's own rows (one query, by study name) and refits both corrections; the memory
  correction goes into the memory budget, so every untried layout's probability of
  fitting and verdict are recomputed (conditioned on the study's OOMs and runs too), and the
  feasible set with them. The runner refits whenever the study has judged more trials.
* :func:`plan_calibration`: the same for ``autotune plan``, from a database that exists.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autotune.errors import SpecError
from autotune.feasibility import Constraints
from autotune.launchers.replay import fewest_timed_steps
from autotune.layout import Layout
from autotune.models.calibration import (
    BUILTIN_WORKLOAD,
    Calibration,
    CalibrationKey,
    MeasuredRow,
    calibrate,
)
from autotune.models.version import stale
from autotune.planning.candidates import Candidate, partition_space, rank_layouts
from autotune.report.timings import STARTUP_PHASES
from autotune.search import TrialSeconds
from autotune.spec import StudySpec
from autotune.trial import RunConfig
from autotune.trial.outcome import Outcome

if TYPE_CHECKING:  # the database layer loads only where a database is read: `plan` on a
    # study without one stays free of SQLAlchemy's ORM and Alembic (its 2 s budget)
    from autotune.storage import Storage

__all__ = ["MAX_EARLIER_ROWS", "DEFAULT_MEMORY_LOG_SD", "workload_of", "key_of",
           "earlier_rows", "warm_start", "own_rows", "memory_log_sd", "StudyLearning",
           "plan_calibration", "open_to_read", "stored_calibration",
           "build_seconds", "trial_seconds"]

MAX_EARLIER_ROWS = 2_000
"""Most rows of earlier studies a warm start reads, the most recent: a bound on one query
of a large shared database (and on each refit, ~0.1 s), and far more than the corrections
need: carried over, what earlier studies know is worth at most ~4 of the study's own
trials (:func:`~autotune.models.calibration.carry_over`: the prior keeps 44% of the fresh
sd), and a few dozen rows come within a few percent of that."""

DEFAULT_MEMORY_LOG_SD = 0.15
"""The memory correction's prior sd when the study has no layout to take its memory
model's stated error from (a replayed table has no memory rule)."""

_COLUMNS = ("study_name", "outcome", "tp", "pp", "dp", "micro_batch", "grad_accum",
            "zero_stage", "recompute", "sequence_parallel", "layout_key",
            "predicted_memory_bytes",
            "peak_memory_bytes", "predicted_tflops_per_device", "model_tflops_per_device",
            "model_version")
_OUTCOMES = (Outcome.COMPLETE.value, Outcome.OOM.value)
_SAMPLE = 256  # layouts whose stated error the prior sd is the median of


def workload_of(launcher_kind: str, workload_kind: str = BUILTIN_WORKLOAD) -> str:
    """What a study's trials measure: a replayed table (its own software stack, whatever
    the study file's workload), else the study's ``workload.kind``.

    >>> workload_of("local", "megatron-deepspeed"), workload_of("replay", "command")
    ('megatron-deepspeed', 'replay')
    """
    return "replay" if launcher_kind == "replay" else workload_kind


def key_of(spec: StudySpec, workload: str) -> CalibrationKey:
    return CalibrationKey(spec.cluster.device, spec.training.dtype, workload)


def _measured(row: dict[str, Any]) -> MeasuredRow:
    layout = Layout(tp=row["tp"], pp=row["pp"], dp=row["dp"], micro_batch=row["micro_batch"],
                    grad_accum=row["grad_accum"], zero_stage=row["zero_stage"],
                    recompute=row["recompute"],
                    sequence_parallel=bool(row["sequence_parallel"]))
    # The columns are the row's own; the key adds the axes that have no column (the ZeRO-3
    # variant, Ulysses) where it spells this layout with them.
    try:
        keyed = Layout.from_key(str(row["layout_key"]))
    except SpecError:
        keyed = None
    if keyed is not None and replace(keyed, zero_variant="none", zero_shard=1,
                                     ulysses=1) == layout:
        layout = keyed
    # Predictions of other models than these (an upgrade since: autotune.models.version)
    # say how wrong those were: no ratio of this study's corrections.
    old = stale(row.get("model_version"))
    return MeasuredRow(row["study_name"], layout, row["outcome"] == Outcome.OOM,
                       None if old else row["predicted_memory_bytes"],
                       row["peak_memory_bytes"],
                       None if old else row["predicted_tflops_per_device"],
                       row["model_tflops_per_device"])


def earlier_rows(storage: Storage, key: CalibrationKey, study: str) -> list[MeasuredRow]:
    """The ``ok`` and ``oom`` rows of every study of ``key`` but ``study``: one query."""
    return warm_start(storage, key, study)[0]


def warm_start(storage: Storage, key: CalibrationKey,
               study: str) -> tuple[list[MeasuredRow], int]:
    """:func:`earlier_rows` without the rows another version of the models predicted
    (:mod:`autotune.models.version`), and how many those were."""
    rows = storage.measurement_rows(_COLUMNS, device_type=key.device_type, dtype=key.dtype,
                                    workload=key.workload, outcomes=_OUTCOMES,
                                    other_than=study, limit=MAX_EARLIER_ROWS)
    kept = [_measured(r) for r in rows if not stale(r.get("model_version"))]
    return kept, len(rows) - len(kept)


def own_rows(storage: Storage, key: CalibrationKey, study: str) -> list[MeasuredRow]:
    """The ``ok`` and ``oom`` rows of ``study`` itself: one query. A row another version
    of the models predicted (the study resumed after an upgrade) still counts as an OOM
    or a run of its layout, but gives no ratio."""
    rows = storage.measurement_rows(_COLUMNS, device_type=key.device_type, dtype=key.dtype,
                                    workload=key.workload, outcomes=_OUTCOMES, study=study)
    return [_measured(r) for r in rows]


def memory_log_sd(constraints: Constraints, spec: StudySpec,
                  layouts: Sequence[Layout]) -> float:
    """The memory model's typical stated error for the study: the median log-sd of its
    uncalibrated verdicts (of at most 256 layouts, evenly spaced in plan order)."""
    if constraints.memory is None or not layouts:
        return DEFAULT_MEMORY_LOG_SD
    step = max(1, len(layouts) // _SAMPLE)
    sds = []
    for layout in sorted(layouts)[::step]:
        fit = constraints.memory_verdict(layout, spec.model)
        if fit is not None and fit.log_sigma > 0:
            sds.append(fit.log_sigma)
    return statistics.median(sds) if sds else DEFAULT_MEMORY_LOG_SD


def build_seconds(launcher_build_s: float | None,
                  timings: Iterable[Mapping[str, Any]]) -> float | None:
    """What a trial spends before its first step, the whole cost of one that runs out of
    memory (:mod:`autotune.search._acquisition`): the launcher's own figure where it has
    one (a replayed table: ``launcher.replay.build_s``), else the median over the study's
    trials' timing breakdowns (``timings_s``) of their start-up and build phases (in a
    batch only the first trial pays the start-up: a trial added to a launch costs that
    little); ``None`` before any trial has a breakdown."""
    if launcher_build_s is not None:
        return float(launcher_build_s)
    phases = (*STARTUP_PHASES, "build")
    seen = [sum(float(t.get(p) or 0.0) for p in phases) for t in timings if t]
    return float(statistics.median(seen)) if seen else None


def trial_seconds(candidate: Candidate | None, run: RunConfig,
                  build_s: float | None) -> TrialSeconds | None:
    """A trial's expected seconds: ``build_s``, then its warm-up and fewest timed steps
    (:func:`autotune.launchers.replay.fewest_timed_steps`) at the candidate's predicted
    step time; ``None`` when either is unknown."""
    if candidate is None or build_s is None:
        return None
    steps = run.warmup_steps + fewest_timed_steps(run)
    return TrialSeconds(build_s, steps * candidate.predicted_step_time_s)


class StudyLearning:
    """One worker's calibration of its study (module docstring).

    ``base``: the study's uncalibrated constraints (``structural_only`` for a replayed
    table, whose ``table`` layouts are the space); ``earlier``: the warm start's rows.
    """

    def __init__(self, spec: StudySpec, base: Constraints, key: CalibrationKey,
                 earlier: Sequence[MeasuredRow], *, table: Sequence[Layout] | None = None,
                 enabled: bool = True, stale: int = 0) -> None:
        self.spec, self.base, self.key, self.enabled = spec, base, key, enabled
        self.earlier, self.stale = tuple(earlier), stale
        self.table = None if table is None else tuple(table)
        # The ranking of the constraints, OOMs and runs it was last asked for (one per
        # refit); made when first asked for: `plan` reads the calibration only, and ranks
        # the space itself.
        self._memo: tuple[tuple[Constraints, tuple[Layout, ...], tuple[Layout, ...]],
                          list[Candidate]] | None = None
        self.memory_log_sd = memory_log_sd(base, spec, self._feasible(base))
        self.usable_bytes = base.memory.usable_bytes if base.memory is not None else None
        self.calibration = self._fit(())
        self.constraints = self._constraints()

    @classmethod
    def from_storage(cls, storage: Storage, spec: StudySpec, base: Constraints,
                     key: CalibrationKey, *, learn: bool,
                     table: Sequence[Layout] | None = None) -> StudyLearning:
        """The learning a run (or ``plan``) of ``spec`` starts from: the warm start's rows
        of ``storage`` (:func:`warm_start`; none unless ``learn``), not yet the study's
        own."""
        earlier, stale_rows = warm_start(storage, key, spec.name) if learn else ([], 0)
        return cls(spec, base, key, earlier, table=table, enabled=learn, stale=stale_rows)

    def copy(self) -> StudyLearning:
        """A learning of its own for another worker (the warm start is shared)."""
        return copy.copy(self)

    def _fit(self, own: Sequence[MeasuredRow]) -> Calibration:
        return replace(calibrate(self.key, self.earlier, own, memory_sd=self.memory_log_sd,
                                 usable_bytes=self.usable_bytes,
                                 zero_stages=self.spec.search.zero_stage), stale=self.stale)

    def _constraints(self) -> Constraints:
        cal = self.calibration
        return self.base.with_memory_correction(cal.memory_factor, cal.memory_sd,
                                                by_stage=cal.memory_stage_corrections())

    def _feasible(self, constraints: Constraints) -> list[Layout]:
        """The layouts ``constraints`` keep: of the space, or of a replayed table's rows
        (checked structurally only, or by the study's full check:
        ``launcher.replay.study_check``)."""
        spec = self.spec
        if self.table is None:
            return partition_space(spec.model, spec.cluster, spec.training, spec.search,
                                   constraints)[0]
        return [lay for lay in self.table if not constraints.check(lay, spec.model)]

    def _rank(self, constraints: Constraints, ooms: Sequence[Layout] = (),
              fits: Sequence[Layout] = ()) -> list[Candidate]:
        # Each kept layout's probability of fitting is conditioned on the OOMs and runs.
        spec = self.spec
        return rank_layouts(spec.model, spec.cluster, self._feasible(constraints),
                            dtype=spec.training.dtype, profile=spec.profile,
                            constraints=constraints, ooms=ooms, fits=fits,
                            stack=spec.training.stack)

    def candidates(self, ooms: Sequence[Layout] = (),
                   fits: Sequence[Layout] = ()) -> list[Candidate]:
        """The feasible layouts under the current calibration, ``p_fit`` conditioned on
        the measured ``ooms`` and on the layouts measured to run, ``fits``."""
        memo = (self.constraints, tuple(ooms), tuple(fits))
        if self._memo is None or self._memo[0] != memo:
            self._memo = (memo, self._rank(self.constraints, ooms, fits))
        return list(self._memo[1])

    def fit_own(self, own: Sequence[MeasuredRow]) -> Calibration:
        """Refit both corrections on the study's own rows ``own`` (the warm start as the
        prior); the constraints follow."""
        self.calibration = self._fit(own)
        self.constraints = self._constraints()
        return self.calibration

    def refit(self, storage: Storage, ooms: Sequence[Layout] = (),
              fits: Sequence[Layout] = ()) -> list[Candidate]:
        """Refit both corrections on the study's rows so far (one query) and return the
        candidates they give."""
        self.fit_own(own_rows(storage, self.key, self.spec.name))
        return self.candidates(ooms, fits)

    def calibrated_memory_bytes(self, layout: Layout) -> float | None:
        """The layout's predicted peak times the memory correction (``None``: no rule)."""
        fit = self.constraints.memory_verdict(layout, self.spec.model)
        return None if fit is None else float(fit.corrected_bytes)


def plan_calibration(spec: StudySpec, *, learn: bool = True,
                     ) -> tuple[Calibration | None, list[Layout], list[Layout], str | None]:
    """What ``autotune plan`` learns from the study's database: the calibration (earlier
    studies' rows unless ``learn`` is false, and the study's own), the study's measured
    OOM layouts and the layouts it measured to run, and a note when the database could
    not be read. A SQLite file that does not exist is not created (nothing to learn
    from)."""
    storage, note = open_to_read(spec)
    if storage is None:
        return None, [], [], note
    try:
        return (*stored_calibration(storage, spec, learn=learn), None)
    finally:
        storage.close()


def open_to_read(spec: StudySpec) -> tuple[Storage | None, str | None]:
    """The study's database opened to calibrate from (the caller closes it), or ``None``:
    with no note where there is nothing to read (a SQLite file that does not exist is not
    created), with ``not calibrated: ...`` where it cannot be opened."""
    from autotune.config.sqlite_file import nothing_to_read

    if nothing_to_read(spec.storage.url):
        return None, None
    from autotune.errors import StorageError
    from autotune.storage import Storage

    try:
        return Storage(spec.storage), None
    except StorageError as err:
        return None, f"not calibrated: {err}"


def stored_calibration(storage: Storage, spec: StudySpec, *, learn: bool = True,
                       ) -> tuple[Calibration, list[Layout], list[Layout]]:
    """:func:`plan_calibration` from an open ``storage``: the calibration a run of ``spec``
    starts from (earlier studies' rows of its key unless ``learn`` is false, then its
    own), its measured OOM layouts and the layouts it measured to run."""
    base = Constraints.from_configs(spec.cluster, spec.training, spec.search, spec.trial,
                                    profile=spec.profile)
    key = key_of(spec, workload_of(spec.launcher.kind, spec.workload.kind))
    learning = StudyLearning.from_storage(storage, spec, base, key, learn=learn)
    own = own_rows(storage, key, spec.name)
    learning.fit_own(own)
    return (learning.calibration, [r.layout for r in own if r.oom],
            [r.layout for r in own if not r.oom])
