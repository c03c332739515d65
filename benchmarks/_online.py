"""The online-calibrated cost model, a row of ``cost_model_accuracy.py`` (issue #13, part 5):
how well the default strategy ranks the layouts it has not tried, calibrated only on the
trials it made itself.

For each group and each ``k`` of ``--online-after`` (default 2 and 4):

1. a study of the group is replayed (``_common.study_strategy`` and ``_common.replay``:
   the default strategy made as the runner makes it, over the candidates the study's
   check keeps, in plan order, each proposal answered from the table) for its first
   ``k`` trials (an OOM trial counts);
2. right after the ``k``-th, before anything else is proposed, the strategy's calibrated
   model is read: its posterior mean of log throughput
   (:meth:`autotune.search.ResidualStrategy.posterior`), fitted on those ``k`` trials
   alone, of every *untried* layout: a candidate it has not measured that ran in the table
   (``ok``: as in the analytic row, an OOM row has no value to rank);
3. that ranking is scored against the table: Spearman's rho of calibrated vs measured
   over the untried layouts, and a **top-3 hit** when the group's measured best (over all
   its ``ok`` rows) is one of the ``k`` measured or one of the 3 untried layouts ranked
   first (a best the check excludes is a miss). The analytic model is scored the same way
   on the same untried layouts (``analytic_*``), side by side.

Nothing measured after the ``k``-th trial reaches the strategy: the replay is lazy, and the
table's values of the untried layouts are read only to score.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.landscape import LandscapeGroup
from autotune.layout import Layout
from autotune.search import Observation, Predictor, ResidualStrategy
from benchmarks import _common as common

__all__ = ["DEFINITION", "Snapshot", "parse_after", "snapshots", "score", "online_group",
           "summarize_online", "print_online"]

DEFINITION = (
    "after k trials of the default strategy replayed as a study (the candidates the "
    "study's check keeps; an OOM trial counts), the strategy's posterior mean of log "
    "throughput, fitted on those k trials only, ranks the layouts it has not tried that "
    "ran (ok); spearman: vs measured over those untried layouts; best_in_top3: the "
    "group's measured best is one of the k measured or among the 3 untried ranked first "
    "(excluded by the check: a miss); analytic_*: the cost model alone, same layouts")
"""The ``online`` row's definition, written into the JSON beside its figures."""


def parse_after(text: str) -> list[int]:
    """``--online-after`` (``"2,4"``; empty: no online row) as distinct trial counts,
    ascending; :class:`ValueError` names a bad one."""
    out = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--online-after: got {part!r}; allowed: trial counts >= 1, "
                             "comma-separated (e.g. 2,4), or empty for none")
        out.add(int(part))
    return sorted(out)


@dataclass(frozen=True)
class Snapshot:
    """What the default strategy knows of a group after ``after`` trials of its own."""

    after: int
    measured: tuple[Observation, ...]
    """Its trials, in order (the only measurements it was given)."""
    untried: tuple[Layout, ...]
    """The kept candidates that ran in the table and that it has not measured, plan order."""
    calibrated: tuple[float, ...]
    """Posterior mean of ``log(model TFLOPS per device)`` of each untried layout."""


def snapshots(group: LandscapeGroup, check: common.StudyCheck | None, after: Sequence[int],
              predict: Predictor) -> list[Snapshot]:
    """One replayed study of ``group``, read after each count of ``after`` trials (none
    for a count the strategy never reaches: too few candidates)."""
    strategy, history = common.study_strategy("default", group, check, seed=0,
                                              predict=predict)
    assert isinstance(strategy, ResidualStrategy)  # what 'default' is
    candidates = common.candidates_of(group)
    if check is not None:
        candidates = check.kept(candidates)
    ran = {m.layout for m in group.ok()}
    wanted, out = set(after), list[Snapshot]()
    if not wanted:
        return out
    for n, _ in enumerate(common.replay(strategy, group, check, history=history), start=1):
        if n in wanted:
            tried = {o.layout for o in history}
            untried = [lay for lay in candidates if lay in ran and lay not in tried]
            mean = (strategy.posterior(candidates, list(history), untried)[0] if untried
                    else np.zeros(0))
            out.append(Snapshot(n, tuple(history), tuple(untried),
                                tuple(float(v) for v in mean)))
        if n >= max(wanted):
            break  # the strategy is asked for nothing more
    return out


def _rho(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho, ``None`` where undefined (fewer than 2 layouts, or constant)."""
    if len(a) < 2:
        return None
    rho = common.spearman(a, b)
    return None if math.isnan(rho) else rho


def score(snap: Snapshot, group: LandscapeGroup, predict: Predictor) -> dict[str, Any]:
    """A snapshot against the table, with the analytic model on the same untried layouts
    (module docstring)."""
    value = {m.layout: float(m.model_tflops_per_device or 0.0) for m in group.ok()}
    measured = [value[lay] for lay in snap.untried]
    analytic = [float(predict(lay)) for lay in snap.untried]
    best = group.best().layout
    best_measured = best in {o.layout for o in snap.measured}

    def top3(scores: Sequence[float]) -> list[Layout]:
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # ties: plan order
        return [snap.untried[i] for i in order[:3]]

    cal_top = top3(snap.calibrated)
    return {"after": snap.after, "measured": [o.layout.key() for o in snap.measured],
            "n_untried": len(snap.untried), "best_measured": best_measured,
            "spearman": _rho(snap.calibrated, measured),
            "best_in_top3": best_measured or best in cal_top,
            "calibrated_best": cal_top[0].key() if cal_top else None,
            "analytic_spearman": _rho(analytic, measured),
            "analytic_best_in_top3": best_measured or best in top3(analytic)}


def online_group(group: LandscapeGroup, check: common.StudyCheck | None,
                 after: Sequence[int], predict: Predictor) -> dict[str, Any]:
    """The group's ``online`` entry: one :func:`score` per count reached."""
    return {"name": group.name, "n_layouts": len(group.ok()),
            "after": {str(s.after): score(s, group, predict)
                      for s in snapshots(group, check, after, predict)}}


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def summarize_online(rows: Sequence[dict[str, Any]], after: Sequence[int]
                     ) -> dict[str, dict[str, Any]]:
    """Per count of trials, over the groups that reached it: the median Spearman of the
    calibrated and of the analytic ranking over the groups where both are defined (the
    same untried layouts), the top-3 hits of each, the misses and how many groups had
    measured their best already."""
    out: dict[str, dict[str, Any]] = {}
    for k in after:
        at = [(r["name"], r["after"][str(k)]) for r in rows if str(k) in r["after"]]
        paired = [s for _, s in at if s["spearman"] is not None
                  and s["analytic_spearman"] is not None]
        out[str(k)] = {
            "n_groups": len(at), "n_spearman": len(paired),
            "median_spearman": _median([s["spearman"] for s in paired]),
            "best_in_top3": sum(bool(s["best_in_top3"]) for _, s in at),
            "top3_misses": [n for n, s in at if not s["best_in_top3"]],
            "best_measured": sum(bool(s["best_measured"]) for _, s in at),
            "analytic_median_spearman_same_layouts": _median(
                [s["analytic_spearman"] for s in paired]),
            "analytic_best_in_top3_same_layouts": sum(
                bool(s["analytic_best_in_top3"]) for _, s in at),
            "mean_untried": (float(np.mean([s["n_untried"] for _, s in at])) if at
                             else None)}
    return out


def print_online(summary: dict[str, dict[str, Any]], error_sd: float = 0.0) -> None:
    """The online row beside the analytic model on the same layouts, one line per count
    (``error_sd``: the cost model's deliberate error, said in the header)."""
    if not summary:
        return
    wrong = (f"; cost model wrong by sd {error_sd:g} per axis value, groups x draws"
             if error_sd > 0 else "")
    print("\nonline-calibrated cost model: the default strategy's posterior after k of its "
          "own trials (replayed study, memory check on), ranking the layouts it has not "
          "tried; top 3 = the measured best is among the k measured or the 3 untried ranked"
          f" first{wrong}")
    print(f"{'after k':>7s} {'groups':>6s} {'untried':>7s} {'median rho':>10s} "
          f"{'analytic':>8s} {'best in top 3':>13s} {'analytic':>8s} {'best measured':>13s}")
    for k, r in summary.items():
        def rho(x: float | None) -> str:
            return "-" if x is None else f"{x:.4f}"
        n = r["n_groups"]
        print(f"{k:>7s} {n:6d} {r['mean_untried'] or 0:7.1f} {rho(r['median_spearman']):>10s} "
              f"{rho(r['analytic_median_spearman_same_layouts']):>8s} "
              f"{r['best_in_top3']:>7d}/{n:<5d} "
              f"{r['analytic_best_in_top3_same_layouts']:>4d}/{n:<3d} {r['best_measured']:13d}")
    for k, r in summary.items():
        misses = r["top3_misses"]
        names = (", ".join(misses) if len(misses) <= 8
                 else f"{len(misses)} (named in the JSON: online.after.{k}.top3_misses)")
        print(f"  after {k}: best not in the calibrated top 3: {names or 'none'}")
