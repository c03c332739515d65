"""The feasible layouts of a study, ranked by the cost model: what the search draws from.

:func:`partition_space` (the space, :mod:`autotune.planning.space`, through the
feasibility check, :mod:`autotune.feasibility`) and :func:`rank_layouts` (the memory and
cost models) are where the four meet, :func:`rank_candidates` the two in one; the planner
shows their output and the study runner searches it.

A candidate's worth is its *expected* throughput, the predicted TFLOPS times the
probability that it fits the device (:attr:`Candidate.expected_tflops`): a layout whose
memory is *uncertain* stays in the space but ranks by what it is expected to give (an
OOM trial gives nothing, costs one short failed step, and rules out its hungrier
siblings). The ranking uses it; the strategies get the two factors apart (``predict``
and ``p_fit``: :func:`autotune.search.make_strategy`), since a layout that ran is a
residual of its prediction alone.

The memory rule is the study's :class:`~autotune.feasibility.Constraints`, calibrated or
not (:mod:`autotune.runner.learning`); ``ooms``, the layouts measured to run out of
memory, condition each ``p_fit`` (:meth:`~autotune.feasibility.Constraints.memory_verdict`).

Each function takes the configs it reads and the study's measured layer times
(``profile``, :attr:`autotune.spec.StudySpec.profile`), never the whole study.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autotune.config.cluster import ClusterConfig
from autotune.config.launcher import ReplayOptions
from autotune.config.model import ModelConfig
from autotune.config.study import SearchConfig, TrainingConfig
from autotune.feasibility import Constraints, Reason
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.models.memory import estimate_memory
from autotune.models.memory_uncertainty import FitVerdict
from autotune.models.profile import LayerProfile
from autotune.planning.space import enumerate_layouts
from autotune.spec import StudySpec

__all__ = ["Candidate", "rank_candidates", "rank_layouts", "partition_space", "partition_layouts",
           "replayed_rows", "table_constraints"]


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    predicted_tflops: float
    """Cost-model model TFLOPS per device."""
    predicted_step_time_s: float
    predicted_memory_bytes: int
    p_fit: float = 1.0
    """Probability that the layout fits the device (1 without a memory rule), conditioned
    on the measured OOMs and runs given to the ranking."""
    memory_verdict: FitVerdict = FitVerdict.FITS
    """*fits* or *uncertain*; *exceeds* only through measured OOMs (a dominating one:
    ``p_fit`` 0, which the strategies skip; siblings conditioned below the threshold keep
    their small ``p_fit``). A layout whose prediction alone exceeds is no candidate."""

    @property
    def expected_tflops(self) -> float:
        """``predicted_tflops * p_fit``: what a trial of this layout is expected to give."""
        return self.predicted_tflops * self.p_fit


def partition_space(model: ModelConfig, cluster: ClusterConfig, training: TrainingConfig,
                    search: SearchConfig, constraints: Constraints,
                    ) -> tuple[list[Layout], list[tuple[Layout, list[Reason]]]]:
    """Every layout of the space (``search``'s axes on ``cluster``'s world size at
    ``training``'s global batch), split into feasible ones and excluded ones with the
    reasons ``constraints`` gives."""
    return partition_layouts(enumerate_layouts(search, cluster.world_size,
                                               training.global_batch,
                                               devices_per_node=cluster.devices_per_node),
                             model, constraints)


def partition_layouts(layouts: Iterable[Layout], model: ModelConfig, constraints: Constraints,
                      ) -> tuple[list[Layout], list[tuple[Layout, list[Reason]]]]:
    """``layouts`` split into feasible ones and excluded ones with the reasons
    ``constraints`` gives: the space's (:func:`partition_space`) or a replayed table's
    rows (:func:`table_constraints`)."""
    feasible, excluded = [], []
    for layout in layouts:
        reasons = constraints.check(layout, model)
        if reasons:
            excluded.append((layout, reasons))
        else:
            feasible.append(layout)
    return feasible, excluded


def replayed_rows(spec: StudySpec) -> tuple[Layout, ...] | None:
    """The rows a replayed study searches (its table's group for the study's model, world
    size and batch: what ``run`` measures, so what ``plan`` ranks), or ``None`` for any
    other launcher, which is not built (a SLURM launcher would probe the scheduler). A
    table with no such group is a :class:`~autotune.errors.SpecError` naming the closest."""
    if spec.launcher.kind != "replay":
        return None
    from autotune.launchers import make_launcher  # only here: no launcher for other plans

    return make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                         source=spec.source).fixed_layouts()


def table_constraints(constraints: Constraints, replay: ReplayOptions | None) -> Constraints:
    """The check a replayed table's rows get, in ``run`` and ``plan`` alike: the rows say
    themselves what ran and what ran out of memory, so only the structural rules apply
    (the study's placement and memory model would hide rows that were measured), unless
    the study asks to be checked as a real study of its cluster
    (``launcher.replay.study_check``, the default: what the benchmarks replay)."""
    if replay is not None and replay.study_check:
        return constraints
    return constraints.structural_only()


def rank_candidates(model: ModelConfig, cluster: ClusterConfig, training: TrainingConfig,
                    search: SearchConfig, constraints: Constraints, *,
                    profile: LayerProfile | None, ooms: Sequence[Layout] = (),
                    fits: Sequence[Layout] = ()) -> list[Candidate]:
    """Feasible layouts, best expected throughput first (ties: fewer devices per model)."""
    feasible, _ = partition_space(model, cluster, training, search, constraints)
    return rank_layouts(model, cluster, feasible, dtype=training.dtype, profile=profile,
                        constraints=constraints, ooms=ooms, fits=fits,
                        stack=training.stack)


def rank_layouts(model: ModelConfig, cluster: ClusterConfig, layouts: Iterable[Layout], *,
                 dtype: str, profile: LayerProfile | None,
                 constraints: Constraints | None = None,
                 ooms: Sequence[Layout] = (), fits: Sequence[Layout] = (),
                 stack: str = "deepspeed") -> list[Candidate]:
    """``layouts`` with their predictions, best expected throughput first (ties: fewer
    devices per model, then layout order). The probability of fitting comes from
    ``constraints``' memory rule, conditioned on the measured ``ooms`` and on the layouts
    measured to run, ``fits`` (:meth:`~autotune.feasibility.Constraints.memory_verdict`);
    without one (a replayed table) every layout has 1."""
    out = []
    # The measured layouts' own verdicts once, not once for every layout they condition.
    headrooms = constraints.measured_headrooms(model, [*ooms, *fits]) if constraints else {}
    for layout in layouts:
        step = estimate_step(model, layout, cluster, dtype=dtype, profile=profile,
                             stack=stack)
        fit = (constraints.memory_verdict(layout, model, ooms=ooms, fits=fits,
                                          headrooms=headrooms)
               if constraints else None)
        if fit is None:
            mem = estimate_memory(model, layout, dtype=dtype, device=cluster.device,
                                  profile=profile, stack=stack).peak_bytes
            out.append(Candidate(layout, step.model_tflops_per_device, step.step_time_s, mem))
        else:
            out.append(Candidate(layout, step.model_tflops_per_device, step.step_time_s,
                                 fit.predicted_bytes, fit.p_fit, fit.verdict))
    out.sort(key=lambda c: (-c.expected_tflops, c.layout.model_parallel_size, c.layout))
    return out
