"""What the benchmarks share: reading landscapes, the study's feasibility check of a group,
a study of it replayed through the strategy interface, and the rank statistic.

* :func:`add_landscape_arguments` / :func:`load_groups`: ``--landscape FILE`` (repeatable;
  default the tables shipped in ``data/landscapes/``), ``--hardware``,
  ``--devices-per-node``, ``--vocab-size``, ``--attention``, ``--min-layouts`` and
  ``--memory-margin``, the same in every benchmark.
* :func:`study_check`: the feasibility check a real study of the group would apply
  (:meth:`autotune.feasibility.Constraints.from_configs` at the study file's defaults, on
  the group's cluster, memory rule and placement included), and what it costs: the
  measured-ok layouts it excludes, whether the measured best is one of them, and the loss
  ``1 - best kept / best``.
* :func:`study_strategy`, :func:`replay` (:func:`study_p_fit`): a study of the group
  replayed through the :class:`autotune.search.Strategy` interface, as the study runner
  drives it: the candidates the check keeps, in plan order, each proposal answered from
  the table by the replay launcher, and the probability of fitting the runner hands its
  strategy (the memory verdict, conditioned on the OOMs measured so far). Both
  benchmarks replay the default strategy through it (``search_efficiency`` to count its
  trials, ``cost_model_accuracy`` to rank with what it has learned: the ``online`` row).
* :func:`spearman`: the rank correlation the accuracy rows report.

Beside it: ``_study_run.py`` (a group replayed by the study runner itself, what ``autotune
run`` does with the group's replay study file) and ``_cost_model_variants.py`` (the cost
model made wrong on purpose, or given layer profiles fitted on held-out groups).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.config.model import ATTENTION_KINDS
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.feasibility import Constraints, Reason
from autotune.landscape import (
    SHIPPED_LANDSCAPES,
    LandscapeGroup,
    load_landscape,
    shipped_landscape,
)
from autotune.launchers.replay import ReplayLauncher
from autotune.layout import Layout
from autotune.models.prediction_spread import scale_sd
from autotune.search import (
    FitProbability,
    Observation,
    Predictor,
    Strategy,
    make_strategy,
    plan_order,
)

__all__ = ["StudyCheck", "add_landscape_arguments", "average_ranks", "candidates_of",
           "excluded_groups", "landscape_paths", "load_groups", "print_study_check", "replay",
           "spearman", "study_check", "study_constraints", "study_p_fit", "study_strategy"]

# ------------------------------------------------------------------------------ landscapes


def add_landscape_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say which tables to read and how to read them."""
    parser.add_argument("--landscape", action="append", metavar="FILE",
                        help="CSV in the vTrain or Aurora format (repeatable; default: the "
                        "tables shipped in data/landscapes/)")
    parser.add_argument("--hardware", metavar="NAME", help="device name where the file "
                        "lacks it")
    parser.add_argument("--devices-per-node", type=int, metavar="N")
    parser.add_argument("--vocab-size", type=int, metavar="N",
                        help="override the file's vocabulary (default: vTrain 51200, "
                        "Aurora 32000: autotune.landscape)")
    parser.add_argument("--attention", choices=ATTENTION_KINDS,
                        help="override the file's attention kind (default: vTrain explicit, "
                        "Aurora flash)")
    parser.add_argument("--min-layouts", type=int, default=8, metavar="N")
    parser.add_argument("--memory-margin", type=float, default=TrialConfig.memory_margin,
                        help="as trial.memory_margin in a study file (default "
                        f"{TrialConfig.memory_margin})")


def landscape_paths(args: argparse.Namespace) -> list[str]:
    """``--landscape`` as given, else the shipped tables."""
    return list(args.landscape or [str(shipped_landscape(n)) for n in SHIPPED_LANDSCAPES])


def load_groups(args: argparse.Namespace) -> list[tuple[str, list[LandscapeGroup]]]:
    """Each file of :func:`landscape_paths` with its groups, read with the options."""
    return [(path, load_landscape(path, hardware=args.hardware,
                                  devices_per_node=args.devices_per_node,
                                  vocab_size=args.vocab_size, attention=args.attention))
            for path in landscape_paths(args)]


# -------------------------------------------------------------------- the study's check


def study_constraints(group: LandscapeGroup, *, memory_margin: float | None = None
                      ) -> Constraints:
    """What a study of ``group``'s model, cluster and global batch checks every layout
    against, its file saying nothing else: :meth:`Constraints.from_configs` of the group's
    cluster and the default ``search`` and ``trial`` sections (as ``autotune/study.py``
    builds it for a study that runs trials, before any table is replayed)."""
    trial = TrialConfig() if memory_margin is None else TrialConfig(memory_margin=memory_margin)
    training = TrainingConfig(group.global_batch, group.dtype, group.stack)  # the table's
    return Constraints.from_configs(group.cluster, training, SearchConfig(), trial)


@dataclass(frozen=True)
class StudyCheck:
    """What the study's feasibility check makes of a group's measured layouts."""

    excluded: dict[Layout, list[Reason]]
    """Every layout of the group the check refuses (ok or not), with its reasons."""
    ok_rows: int
    ok_excluded: int
    """Layouts that ran (``ok``) and that the check excludes: a study could never try them."""
    best_excluded: bool
    """The measured best is excluded: a study could never find it."""
    loss: float | None
    """``1 - best kept / best``: what a study loses at most (0 when the best is kept, 1 when
    nothing that ran is kept; ``None`` without an ``ok`` row)."""
    reasons: dict[str, int]
    """Excluded ``ok`` layouts by reason code (``memory``, ``tp_cross_node``...)."""
    constraints: Constraints | None = field(default=None, compare=False, repr=False)
    """The constraints checked (:func:`study_constraints`): their memory rule gives the
    replayed strategy its probabilities of fitting (:func:`study_p_fit`)."""

    def kept(self, layouts: Sequence[Layout]) -> list[Layout]:
        """``layouts`` less the excluded ones, in their order."""
        return [lay for lay in layouts if lay not in self.excluded]

    def to_dict(self) -> dict[str, Any]:
        """The per-group keys of both benchmarks' JSON."""
        return {"ok_excluded": self.ok_excluded, "best_excluded": self.best_excluded,
                "loss": self.loss, "excluded_reasons": self.reasons}


def study_check(group: LandscapeGroup, *, memory_margin: float | None = None) -> StudyCheck:
    """:func:`study_constraints` applied to every measured layout of ``group``."""
    constraints = study_constraints(group, memory_margin=memory_margin)
    excluded = {m.layout: why for m in group.measurements
                if (why := constraints.check(m.layout, group.model))}
    ok = group.ok()
    ok_out = [m for m in ok if m.layout in excluded]
    loss = best_excluded = None
    if ok:
        best = group.best()
        kept = [m.model_tflops_per_device or 0.0 for m in ok if m.layout not in excluded]
        top = best.model_tflops_per_device or 0.0
        best_excluded = best.layout in excluded
        loss = 1.0 - max(kept, default=0.0) / top if top > 0 else None
    reasons = Counter(r.code for m in ok_out for r in excluded[m.layout])
    return StudyCheck(excluded=excluded, ok_rows=len(ok), ok_excluded=len(ok_out),
                      best_excluded=bool(best_excluded), loss=loss, reasons=dict(reasons),
                      constraints=constraints)


def excluded_groups(pairs: Sequence[tuple[LandscapeGroup, StudyCheck]]) -> list[dict[str, Any]]:
    """The groups where the check excludes a layout that ran, for the JSON and the text."""
    return [{"name": g.name, "ok_rows": c.ok_rows, **c.to_dict()}
            for g, c in pairs if c.ok_excluded]


def print_study_check(pairs: Sequence[tuple[LandscapeGroup, StudyCheck]], what: str) -> None:
    """One summary line, then one line per group where a layout that ran is excluded."""
    ok_rows = sum(c.ok_rows for _, c in pairs)
    ok_out = sum(c.ok_excluded for _, c in pairs)
    best_out = [g.name for g, c in pairs if c.best_excluded]
    print(f"study feasibility check (default settings, memory and placement) over {what}: "
          f"{ok_out} of {ok_rows} ok rows excluded; measured best excluded in "
          f"{len(best_out)} group(s)")
    for row in excluded_groups(pairs):
        loss = "-" if row["loss"] is None else f"{row['loss']:.1%}"
        why = ", ".join(f"{k} {v}" for k, v in sorted(row["excluded_reasons"].items()))
        print(f"  {row['name']}: {row['ok_excluded']}/{row['ok_rows']} ok excluded ({why}); "
              f"best excluded: {row['best_excluded']}; best kept is {loss} below the best")


# --------------------------------------------------------------------- replaying a study


def candidates_of(group: LandscapeGroup) -> list[Layout]:
    """The group's layouts in plan order, as the study runner hands them to a strategy."""
    return plan_order(group.layouts())


def study_p_fit(group: LandscapeGroup, check: StudyCheck | None,
                history: Sequence[Observation]) -> FitProbability | None:
    """What the runner hands a strategy as ``p_fit`` (:mod:`autotune.runner.study`): each
    layout's memory verdict under the study's constraints, conditioned on the OOMs of
    ``history`` (read at every call: pass the list :func:`replay` records into) as the
    runner conditions its candidates after each trial. ``None`` without a check or a memory
    rule (every layout fits). Not replayed: the memory correction the runner also refits
    from those OOMs (a table holds no measured peaks; an OOM bound moves it, docs/models.md
    "Calibration from measurements")."""
    constraints = None if check is None else check.constraints
    if constraints is None or constraints.memory is None:
        return None
    cache: dict[tuple[Layout, tuple[Layout, ...]], float] = {}

    def p_fit(layout: Layout) -> float:
        ooms = tuple(o.layout for o in history if o.status == "oom")
        if (layout, ooms) not in cache:
            fit = constraints.memory_verdict(layout, group.model, ooms=ooms)
            cache[layout, ooms] = 1.0 if fit is None else fit.p_fit
        return cache[layout, ooms]

    return p_fit


def study_strategy(name: str, group: LandscapeGroup, check: StudyCheck | None, *, seed: int,
                   predict: Predictor | None, **options: Any
                   ) -> tuple[Strategy, list[Observation]]:
    """A fresh strategy for a replayed study of ``group``, made as the runner makes it
    (:func:`autotune.search.make_strategy` with ``predict`` and the study's ``p_fit``,
    :func:`study_p_fit`; ``options``: ``min_improvement``...), and the empty history that
    ``p_fit`` reads: hand it to :func:`replay`."""
    history: list[Observation] = []
    strategy = make_strategy(name, seed=seed, predict=predict,
                             p_fit=study_p_fit(group, check, history),
                             scale_sd=scale_sd(group.cluster.device), **options)
    return strategy, history


def replay(strategy: Strategy, group: LandscapeGroup, check: StudyCheck | None = None, *,
           history: list[Observation] | None = None) -> Iterator[Observation]:
    """Replay a study: each layout the strategy proposes, measured from the table, in order,
    until it proposes nothing (then ``strategy.stop`` says whether it stopped early). The
    candidates are the group's layouts that ``check`` keeps (all without one); ``history``
    (default: a new list) records the observations (the one :func:`study_p_fit` reads).
    Raises if it proposes a non-candidate or a repeat."""
    launcher = ReplayLauncher(group)
    candidates = candidates_of(group)
    if check is not None:
        candidates = check.kept(candidates)
    history = [] if history is None else history
    while (lay := strategy.propose(candidates, history)) is not None:
        if lay in {o.layout for o in history}:
            raise RuntimeError(f"{strategy.name} proposed {lay} twice")
        if lay not in candidates:
            raise RuntimeError(f"{strategy.name} proposed {lay}, which is no candidate")
        res = launcher.result_for(lay)
        if res.status == "ok":
            obs = Observation(lay, "ok", res.model_tflops_per_device)
        else:
            obs = Observation(lay, "oom" if res.status == "oom" else "error")
        history.append(obs)
        yield obs


# ------------------------------------------------------------------------ rank statistics


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n with ties given the mean of the ranks they span."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tied = x == v
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks (NaN if constant)."""
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])
