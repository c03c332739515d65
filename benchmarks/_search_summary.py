"""What ``search_efficiency.py`` reports of its replays: each group's row per strategy
(:func:`summarize` of its runs; :func:`score_groups`, with the analytic random figures), the
rows over groups (:func:`summarize_rows`), the early stop's runs and summary
(:func:`summarize_early_stop`, :func:`report_early_stop`), and the printed tables. The JSON
keys are those of docs/search.md, "Benchmark".
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from autotune.landscape import LandscapeGroup
from benchmarks._common import StudyCheck, candidates_of
from benchmarks._search_replays import (
    DETERMINISTIC,
    Hit,
    Run,
    Task,
    good_count,
    random_expectation,
    random_success_probability,
)

__all__ = ["Summary", "print_summary", "report_early_stop", "score_groups", "summarize",
           "summarize_early_stop", "summarize_rows"]

Summary = dict[str, float | None]
"""One row's figures (``median_trials``, ``success_rate``...): a JSON object of the output."""


def summarize_early_stop(runs: list[Run]) -> dict[str, float | None]:
    """Over runs (groups x draws): trials spent (mean, median, max), the fraction stopped
    before the budget, the success rate and the regret (mean, max)."""
    trials = [float(r["trials"] or 0) for r in runs]
    regrets = [float(r["regret"]) for r in runs if r["regret"] is not None]
    return {"mean_trials": statistics.fmean(trials) if trials else None,
            "median_trials": statistics.median(trials) if trials else None,
            "max_trials": max(trials) if trials else None,
            "stopped_rate": statistics.fmean(bool(r["stopped"]) for r in runs) if runs else None,
            "success_rate": statistics.fmean(bool(r["success"]) for r in runs) if runs else None,
            "mean_regret": statistics.fmean(regrets) if regrets else None,
            "max_regret": max(regrets) if regrets else None}


def summarize(hits: list[Hit], budget: int) -> dict[str, float | None]:
    """Median and quartiles of trials-to-hit (a miss counts as infinitely many), the
    fraction of runs that hit within the budget, and the median and largest device-seconds
    to the hit (``None`` when a run missed)."""
    vals = sorted(math.inf if t is None else float(t) for t, _ in hits)
    secs = sorted(math.inf if d is None else float(d) for _, d in hits)
    finite = [v for v in vals if math.isfinite(v)]
    return {"median_trials": _fin(statistics.median(vals)),
            "q1_trials": _fin(_quantile(vals, 0.25)), "q3_trials": _fin(_quantile(vals, 0.75)),
            "mean_trials": statistics.fmean(finite) if len(finite) == len(vals) else None,
            "success_rate": sum(1 for v in vals if v <= budget) / len(vals),
            "median_device_seconds": _fin(statistics.median(secs)),
            "max_device_seconds": _fin(max(secs))}


def score_groups(args: argparse.Namespace, groups: list[LandscapeGroup],
                 checks: list[StudyCheck], tasks: list[Task], results: list[list[Hit]],
                 rows: list[str], profiled_rows: dict[str, dict[str, str]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Summary]]]:
    """Per group: its JSON entry and each row's :func:`summarize`; prints one line each."""
    per_group: dict[str, dict[str, list[Hit]]] = {}
    for task, res in zip(tasks, results, strict=True):
        per_group.setdefault(task.group.name, {})[task.label] = res
    strategies = args.strategy_list
    entries: list[dict[str, Any]] = []
    group_rows: list[dict[str, Summary]] = []
    # Analytic columns keep their 10 characters; the longer profiled labels widen theirs.
    widths = {r: 10 if r in strategies else max(10, len(r)) for r in rows}
    print(f"{'group':44s} {'N':>3s} {'k':>3s} {'rnd E':>6s}" + "".join(
        f" {r[:widths[r]]:>{widths[r]}s}" for r in rows))
    for g, check in zip(groups, checks, strict=True):
        n, k = len(check.kept(candidates_of(g))), good_count(g, args.tolerance, check)
        by_row = {r: summarize(per_group[g.name][r], args.budget) for r in rows}
        entry = {"name": g.name, "n_layouts": len(g.measurements), "n_candidates": n,
                 "n_good": k, "random_expected_trials": random_expectation(n, k),
                 "random_expected_success_rate": random_success_probability(n, k, args.budget),
                 **check.to_dict(), "strategies": {s: by_row[s] for s in strategies}}
        if profiled_rows:
            entry["profiled"] = {scheme: {s: by_row[r] for s, r in by_s.items()}
                                 for scheme, by_s in profiled_rows.items()}
        entries.append(entry)
        group_rows.append(by_row)
        cells = "".join(f" {_fmt(by_row[r]['median_trials']):>{widths[r]}s}" for r in rows)
        failed = "  (measured best excluded: a failure)" if check.best_excluded else ""
        print(f"{g.name[:44]:44s} {len(g.measurements):3d} {k:3d} "
              f"{entry['random_expected_trials']:6.2f}{cells}{failed}")
    return entries, group_rows


def summarize_rows(rows: list[str], group_rows: list[dict[str, Summary]],
                   entries: list[dict[str, Any]]) -> dict[str, Summary]:
    """Per row over groups: the median and quartiles of the group medians, the worst group,
    the success rate, the mean trials and the speed-up over the analytic random mean."""
    summary: dict[str, Summary] = {}
    for s in rows:
        medians = [_inf(by_row[s]["median_trials"]) for by_row in group_rows]
        rates = [by_row[s]["success_rate"] or 0.0 for by_row in group_rows]
        secs = [_inf(by_row[s]["median_device_seconds"]) for by_row in group_rows]
        summary[s] = {
            "median_trials": _fin(statistics.median(medians)) if medians else None,
            "q1_trials": _fin(_quantile(medians, 0.25)),
            "q3_trials": _fin(_quantile(medians, 0.75)),
            "max_group_median_trials": _fin(max(medians)) if medians else None,
            "success_rate": statistics.fmean(rates) if rates else None,
            "median_device_seconds": _fin(statistics.median(secs)) if secs else None,
            "max_group_median_device_seconds": _fin(max(secs)) if secs else None,
        }
    if entries:
        # Against the analytic random expectation (noise-free): mean trials over groups.
        expected_random = statistics.fmean(e["random_expected_trials"] for e in entries)
        for s in rows:
            mean = statistics.fmean(_inf(by_row[s]["mean_trials"]) for by_row in group_rows)
            summary[s]["mean_trials"] = _fin(mean)
            summary[s]["speedup_vs_random"] = (expected_random / mean if math.isfinite(mean)
                                               else None)  # a miss in some group: undefined
    return summary


def print_summary(args: argparse.Namespace, rows: list[str], summary: dict[str, Summary],
                  entries: list[dict[str, Any]], elapsed_s: float) -> None:
    """The random search check, then one line per row."""
    if "random" in args.strategy_list and entries:
        measured = [e["strategies"]["random"]["mean_trials"] for e in entries]
        expected = [e["random_expected_trials"] for e in entries]
        print(f"\nrandom search check: mean over groups of measured mean trials "
              f"{statistics.fmean(m for m in measured if m is not None):.2f}, analytic "
              f"(N+1)/(k+1) {statistics.fmean(expected):.2f}; median of group medians "
              f"{summary['random']['median_trials']}")
    print(f"\nsummary over {len(entries)} groups (tolerance {args.tolerance:.0%}, "
          f"budget {args.budget}; {elapsed_s:.0f} s):")
    if any(r.split("+")[0] == "default" for r in rows):
        print("default = the cost model calibrated online: before each proposal its "
              "residual model is refitted on the trials made so far (the ranking it gives: "
              "cost_model_accuracy.py, 'online')")
    name_width = max([16, *(len(r) for r in rows)])
    print(f"{'strategy':{name_width}s} {'median':>7s} {'q1':>5s} {'q3':>5s} {'worst':>6s} "
          f"{'mean':>5s} {'success':>8s} {'x random':>9s} {'dev-s median':>12s} "
          f"{'worst':>9s}")
    for s in rows:
        r = summary[s]
        print(f"{s:{name_width}s} {_fmt(r['median_trials']):>7s} {_fmt(r['q1_trials']):>5s} "
              f"{_fmt(r['q3_trials']):>5s} {_fmt(r['max_group_median_trials']):>6s} "
              f"{_fmt(r.get('mean_trials')):>5s} "
              f"{r['success_rate'] or 0:8.1%} {_fmt(r.get('speedup_vs_random')):>9s} "
              f"{_fmt0(r['median_device_seconds']):>12s} "
              f"{_fmt0(r['max_group_median_device_seconds']):>9s}")
    print("device-seconds: to the hit, each trial's replayed timing breakdown times its "
          "devices (an OOM: a failed build, launcher.replay.build_s); rows through the "
          f"study runner itself: {', '.join(r for r in rows if r in DETERMINISTIC)}")


def report_early_stop(args: argparse.Namespace, groups: list[LandscapeGroup],
                      entries: list[dict[str, Any]], stops: list[float | None],
                      early: list[list[Run]]) -> list[dict[str, float | None]]:
    """The early-stop runs into the group entries; the summary per threshold, printed."""
    if not early:
        return []
    for entry, runs in zip(entries, early, strict=True):
        entry["early_stop"] = runs
    summary = [{"min_improvement": m, "cost_model_error": args.cost_model_error,
                **summarize_early_stop([r for runs in early for r in runs
                                        if r["min_improvement"] == m])}
               for m in stops]
    _print_early_stop(groups, stops, early, summary, args.budget, args.tolerance,
                      args.cost_model_error)
    return summary


def _print_early_stop(groups: list[LandscapeGroup], stops: list[float | None],
                      early: list[list[Run]], summary: list[dict[str, float | None]],
                      budget: int, tolerance: float, error: float) -> None:
    """Per group and threshold: mean trials spent (``*``: every draw stopped before the
    budget) and the largest regret; then the summary over groups (and draws)."""
    names = ["off" if m is None else f"{m:.2%}" for m in stops]
    noise = f", cost model error sd {error:g}" if error > 0 else ""
    print(f"\nearly stop of 'default' (trials spent, * = stopped before the budget {budget};"
          f" regret = 1 - best found / group best{noise}):")
    print(f"{'group':44s}" + "".join(f" {n:>15s}" for n in names))
    for g, runs in zip(groups, early, strict=True):
        cells = ""
        for m in stops:
            mine = [r for r in runs if r["min_improvement"] == m]
            trials = statistics.fmean(float(r["trials"] or 0) for r in mine)
            star = "*" if all(r["stopped"] for r in mine) else " "
            regret = max((float(r["regret"]) for r in mine if r["regret"] is not None),
                         default=None)
            cells += f" {trials:>5.1f}{star} {_pct(regret):>8s}"
        print(f"{g.name[:44]:44s}{cells}")
    print(f"\nearly stop over {len(groups)} groups (tolerance {tolerance:.0%}, budget {budget}"
          f"{noise}):")
    print(f"{'min_improvement':16s} {'trials mean':>11s} {'median':>7s} {'max':>4s} "
          f"{'stopped':>8s} {'success':>8s} {'regret mean':>12s} {'max':>7s}")
    for name, r in zip(names, summary, strict=True):
        print(f"{name:16s} {_fmt(r['mean_trials']):>11s} {_fmt(r['median_trials']):>7s} "
              f"{_fmt(r['max_trials']):>4s} {r['stopped_rate'] or 0:8.1%} "
              f"{r['success_rate'] or 0:8.1%} {_pct(r['mean_regret']):>12s} "
              f"{_pct(r['max_regret']):>7s}")


def _pct(x: float | int | bool | None) -> str:
    return "-" if x is None else f"{float(x):.2%}"


def _inf(x: float | None) -> float:
    return math.inf if x is None else x


def _fin(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def _quantile(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _fmt0(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"
