"""What the benchmarks share: reading landscapes, the study's feasibility check of a group,
and layer profiles fitted on held-out groups.

* :func:`add_landscape_arguments` / :func:`load_groups`: ``--landscape FILE`` (repeatable;
  default the tables shipped in ``data/landscapes/``), ``--hardware``,
  ``--devices-per-node``, ``--vocab-size``, ``--attention``, ``--min-layouts`` and
  ``--memory-margin``, the same in every benchmark.
* :func:`study_check`: the feasibility check a real study of the group would apply
  (:meth:`autotune.feasibility.Constraints.from_configs` at the study file's defaults, on
  the group's cluster, memory rule and placement included), and what it costs: the
  measured-ok layouts it excludes, whether the measured best is one of them, and the loss
  ``1 - best kept / best``.
* :func:`held_out_profiles` (``--profile-cv``): for each group, a layer profile fitted only
  on groups of another layer count, device count or global batch (handed to the cost model
  as ``profile=``; the cluster names a profile's path only).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config.model import ATTENTION_KINDS
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.feasibility import Constraints, Reason
from autotune.landscape import (
    SHIPPED_LANDSCAPES,
    LandscapeGroup,
    load_landscape,
    shipped_landscape,
)
from autotune.layout import Layout
from autotune.models.profile import LayerProfile
from autotune.models.profile_fit import fit_layer_profile, landscape_samples

__all__ = ["CV_SCHEMES", "StudyCheck", "add_landscape_arguments", "add_profile_cv_argument",
           "excluded_groups", "held_out_profiles", "landscape_paths", "load_groups",
           "parse_profile_cv", "print_study_check", "study_check", "study_constraints"]

# ------------------------------------------------------------------------------ landscapes


def add_landscape_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say which tables to read and how to read them."""
    parser.add_argument("--landscape", action="append", metavar="FILE",
                        help="CSV in the vTrain or Aurora format (repeatable; default: the "
                        "tables shipped in data/landscapes/)")
    parser.add_argument("--hardware", metavar="NAME", help="device name where the file "
                        "lacks it")
    parser.add_argument("--devices-per-node", type=int, metavar="N")
    parser.add_argument("--vocab-size", type=int, default=51200, metavar="N")
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
    training = TrainingConfig(global_batch=group.global_batch, dtype=group.dtype)
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
                      best_excluded=bool(best_excluded), loss=loss, reasons=dict(reasons))


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


# ----------------------------------------------------------------- held-out layer profiles

CV_SCHEMES: dict[str, Callable[[LandscapeGroup], int]] = {
    "layers": lambda g: g.model.n_layer,
    "world": lambda g: g.world_size,
    "batch": lambda g: g.global_batch,
}
"""Cross-validation schemes of measured layer profiles: the key whose every value is held
out in turn. Each is a situation a user is in: profiles from shallower or deeper models of
the same width (``layers``), from other device counts (``world``), from other global
batches (``batch``)."""


def parse_profile_cv(values: Sequence[str]) -> list[str]:
    """``--profile-cv`` values (repeated or comma lists) as distinct scheme names, in order;
    :class:`ValueError` names an unknown one."""
    schemes = [v.strip() for value in values for v in value.split(",") if v.strip()]
    for s in schemes:
        if s not in CV_SCHEMES:
            raise ValueError(f"--profile-cv: unknown {s!r}; allowed: {', '.join(CV_SCHEMES)}")
    return list(dict.fromkeys(schemes))


def add_profile_cv_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--profile-cv`` option, the same in both benchmarks."""
    parser.add_argument("--profile-cv", action="append", default=[], metavar="SCHEME",
                        help="also predict with layer profiles fitted on the other groups "
                        f"(held out by: {', '.join(CV_SCHEMES)}; repeatable or a comma list)")


def held_out_profiles(groups: Sequence[LandscapeGroup], scheme: str,
                      fit_on: Sequence[LandscapeGroup] | None = None) -> list[LayerProfile]:
    """For each of ``groups``, the profile fitted on the groups of ``fit_on`` (default:
    ``groups``) whose ``scheme`` key differs from its own: nothing measured in a group, nor
    in any group sharing its key, enters its prediction. One fit per key value."""
    key = CV_SCHEMES[scheme]
    pool = groups if fit_on is None else fit_on
    folds: dict[int, LayerProfile] = {}
    for value in sorted({key(g) for g in groups}):
        folds[value] = fit_layer_profile(
            landscape_samples(g for g in pool if key(g) != value),
            source=f"landscape groups with {scheme} != {value}")
    return [folds[key(g)] for g in groups]
