"""How many trials each search strategy needs to find a near-best layout on real landscapes.

Every landscape group (same model, devices and global batch) with at least
``--min-layouts`` measured layouts is replayed as a study: its layouts are the candidates
(in plan order), the strategy proposes one at a time through the same
:class:`autotune.search.Strategy` interface the study runner uses, and the replay
launcher (:class:`autotune.launchers.replay.ReplayLauncher`) answers with the table's
value. Counted: trials until a layout within ``--tolerance`` of the group's best was
measured (OOM trials count), over ``--repeats`` seeds (one run for deterministic
strategies). The random strategy is checked against its analytic expectation
``(N + 1) / (k + 1)`` for ``k`` good layouts among ``N``.

    python benchmarks/search_efficiency.py \\
        --landscape ../shared/landscapes/vtrain_a100_single_node.csv \\
        --landscape ../shared/landscapes/aurora_pvc_70b.csv --json search.json

``--json`` writes the format of ``shared/CONTRACTS.md`` (extended: quartiles, mean trials,
speed-up = analytic random mean / strategy mean, the analytic random expectation). Runs in
minutes on 2 cores (tpe and gp get ``--optuna-repeats`` seeds: Optuna's GP refits per ask).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.landscape import LandscapeGroup, load_landscape
from autotune.launchers.replay import ReplayLauncher
from autotune.layout import Layout
from autotune.search import (
    STRATEGIES,
    Observation,
    Strategy,
    cost_model_predictor,
    make_strategy,
)

DETERMINISTIC = {"default", "grid", "cost-model-only"}
"""Strategies whose proposals do not depend on the seed: one run stands for all."""


def candidates_of(group: LandscapeGroup) -> list[Layout]:
    """The group's layouts in plan order (the order :func:`autotune.space.enumerate_layouts`
    lists them: tp, pp, micro-batch, ZeRO stage, recompute)."""
    return sorted(group.layouts(), key=lambda lay: (lay.tp, lay.pp, lay.micro_batch,
                                                    lay.zero_stage, lay.recompute))


def threshold_of(group: LandscapeGroup, tolerance: float) -> float:
    return (group.best().model_tflops_per_device or 0.0) * (1.0 - tolerance)


def good_count(group: LandscapeGroup, tolerance: float) -> int:
    thr = threshold_of(group, tolerance)
    return sum(1 for m in group.ok() if (m.model_tflops_per_device or 0.0) >= thr)


def random_expectation(n: int, k: int) -> float:
    """Expected trials of random sampling without replacement until one of ``k`` good
    items among ``n`` is drawn: ``(n + 1) / (k + 1)``."""
    return (n + 1) / (k + 1)


def random_success_probability(n: int, k: int, budget: int) -> float:
    """Probability that random search draws a good item within ``budget`` trials."""
    if budget >= n - k + 1:
        return 1.0
    return 1.0 - math.comb(n - k, budget) / math.comb(n, budget)


def trials_to_hit(strategy: Strategy, group: LandscapeGroup, tolerance: float) -> int | None:
    """Replay a study: trials until a layout within ``tolerance`` of the best is measured,
    ``None`` if the strategy stops first. Raises if it proposes a non-candidate or a repeat.
    """
    launcher = ReplayLauncher(group)
    candidates = candidates_of(group)
    threshold = threshold_of(group, tolerance)
    history: list[Observation] = []
    seen: set[Layout] = set()
    for n in range(1, len(candidates) + 1):
        lay = strategy.propose(candidates, history)
        if lay is None:
            return None
        if lay in seen:
            raise RuntimeError(f"{strategy.name} proposed {lay} twice")
        seen.add(lay)
        res = launcher.result_for(lay)  # LaunchError if not a candidate
        if res.status == "ok":
            value = res.model_tflops_per_device
            history.append(Observation(lay, "ok", value))
            if value is not None and value >= threshold:
                return n
        else:
            history.append(Observation(lay, "oom" if res.status == "oom" else "error"))
    return None


@dataclass
class Task:
    group: LandscapeGroup
    strategy: str
    seeds: list[int]
    tolerance: float


def run_task(task: Task) -> list[int | None]:
    predict = cost_model_predictor(task.group.model, task.group.cluster, dtype=task.group.dtype)
    return [trials_to_hit(make_strategy(task.strategy, seed=seed, predict=predict), task.group,
                          task.tolerance) for seed in task.seeds]


def summarize(trials: list[int | None], budget: int) -> dict[str, float | None]:
    """Median and quartiles of trials-to-hit (a miss counts as infinitely many) and the
    fraction of runs that hit within the budget."""
    vals = sorted(math.inf if t is None else float(t) for t in trials)

    finite = [v for v in vals if math.isfinite(v)]
    return {"median_trials": _fin(statistics.median(vals)),
            "q1_trials": _fin(_quantile(vals, 0.25)), "q3_trials": _fin(_quantile(vals, 0.75)),
            "mean_trials": statistics.fmean(finite) if len(finite) == len(vals) else None,
            "success_rate": sum(1 for v in vals if v <= budget) / len(vals)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--landscape", action="append", required=True, help="CSV (repeatable)")
    ap.add_argument("--strategies", default="default,random,grid,cost-model-only,tpe,gp")
    ap.add_argument("--repeats", type=int, default=20, help="seeds per random strategy")
    ap.add_argument("--optuna-repeats", type=int, default=3,
                    help="seeds for tpe and gp (Optuna's GP refits per ask: seconds a run)")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--hardware", default=None, help="device name where the file lacks it")
    ap.add_argument("--devices-per-node", type=int, default=None)
    ap.add_argument("--vocab-size", type=int, default=51200)
    ap.add_argument("--min-layouts", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default=None, help="write the summary here")
    args = ap.parse_args(argv)

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in STRATEGIES:
            ap.error(f"--strategies: unknown {s!r}; allowed: {', '.join(STRATEGIES)}")
    groups: list[LandscapeGroup] = []
    for path in args.landscape:
        loaded = load_landscape(path, hardware=args.hardware,
                                devices_per_node=args.devices_per_node,
                                vocab_size=args.vocab_size)
        usable = [g for g in loaded if len(g.measurements) >= args.min_layouts and g.ok()]
        print(f"{path}: {len(loaded)} groups, {len(usable)} with >= {args.min_layouts} "
              "layouts", file=sys.stderr)
        groups.extend(usable)
    if not groups:
        print("no landscape group is large enough", file=sys.stderr)

    def seeds(strategy: str) -> list[int]:
        if strategy in DETERMINISTIC:
            return [0]
        return list(range(args.optuna_repeats if strategy in ("tpe", "gp") else args.repeats))

    tasks = [Task(g, s, seeds(s), args.tolerance) for g in groups for s in strategies]
    started = time.monotonic()
    if args.jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(run_task, tasks, chunksize=1))
    else:
        results = [run_task(t) for t in tasks]
    elapsed = time.monotonic() - started

    per_group: dict[str, dict[str, list[int | None]]] = {}
    for task, res in zip(tasks, results, strict=True):
        per_group.setdefault(task.group.name, {})[task.strategy] = res

    out_groups = []
    header = f"{'group':44s} {'N':>3s} {'k':>3s} {'rnd E':>6s}" + "".join(
        f" {s[:10]:>10s}" for s in strategies)
    print(header)
    for g in groups:
        n, k = len(g.measurements), good_count(g, args.tolerance)
        entry = {"name": g.name, "n_layouts": n, "n_good": k,
                 "random_expected_trials": random_expectation(n, k),
                 "random_expected_success_rate": random_success_probability(n, k, args.budget),
                 "strategies": {s: summarize(per_group[g.name][s], args.budget)
                                for s in strategies}}
        out_groups.append(entry)
        cells = "".join(f" {_fmt(entry['strategies'][s]['median_trials']):>10s}"
                        for s in strategies)
        print(f"{g.name[:44]:44s} {n:3d} {k:3d} {entry['random_expected_trials']:6.2f}{cells}")

    summary = {}
    for s in strategies:
        medians = [_inf(e["strategies"][s]["median_trials"]) for e in out_groups]
        rates = [e["strategies"][s]["success_rate"] for e in out_groups]
        summary[s] = {
            "median_trials": _fin(statistics.median(medians)) if medians else None,
            "q1_trials": _fin(_quantile(medians, 0.25)),
            "q3_trials": _fin(_quantile(medians, 0.75)),
            "max_group_median_trials": _fin(max(medians)) if medians else None,
            "success_rate": statistics.fmean(rates) if rates else None,
        }
    if out_groups:
        # Against the analytic random expectation (noise-free): mean trials over groups.
        expected_random = statistics.fmean(e["random_expected_trials"] for e in out_groups)
        for s in strategies:
            means = [_inf(e["strategies"][s]["mean_trials"]) for e in out_groups]
            summary[s]["mean_trials"] = _fin(statistics.fmean(means))
            summary[s]["speedup_vs_random"] = _fin(expected_random / statistics.fmean(means))
    if "random" in strategies and out_groups:
        measured = [e["strategies"]["random"]["mean_trials"] for e in out_groups]
        expected = [e["random_expected_trials"] for e in out_groups]
        print(f"\nrandom search check: mean over groups of measured mean trials "
              f"{statistics.fmean(m for m in measured if m is not None):.2f}, analytic "
              f"(N+1)/(k+1) {statistics.fmean(expected):.2f}; median of group medians "
              f"{summary['random']['median_trials']}")
    print(f"\nsummary over {len(out_groups)} groups (tolerance {args.tolerance:.0%}, "
          f"budget {args.budget}; {elapsed:.0f} s):")
    print(f"{'strategy':16s} {'median':>7s} {'q1':>5s} {'q3':>5s} {'worst':>6s} "
          f"{'mean':>5s} {'success':>8s} {'x random':>9s}")
    for s in strategies:
        r = summary[s]
        print(f"{s:16s} {_fmt(r['median_trials']):>7s} {_fmt(r['q1_trials']):>5s} "
              f"{_fmt(r['q3_trials']):>5s} {_fmt(r['max_group_median_trials']):>6s} "
              f"{_fmt(r.get('mean_trials')):>5s} "
              f"{r['success_rate'] or 0:8.1%} {_fmt(r.get('speedup_vs_random')):>9s}")
    if args.json:
        doc = {"tolerance": args.tolerance, "budget": args.budget, "repeats": args.repeats,
               "min_layouts": args.min_layouts, "landscapes": args.landscape,
               "strategies": summary, "groups": out_groups}
        Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return 0


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


if __name__ == "__main__":
    raise SystemExit(main())
