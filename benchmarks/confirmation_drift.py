"""How often a study names the true best under drift, with and without the confirmation
round (issue #24), and what the round costs.

A synthetic replay table (8 layouts of one 4-device group: step times 100, 101.5, 103,
104, 108, 115, 125 and 140 ms; nothing fitted to anything) is answered through
``launcher.replay.drift`` as a drifting machine would answer it: a common factor that
random-walks from answer to answer (the machine's load: log-steps of ``--walk``) times an
independent factor per layout and answer (a neighbour's burst: log-sd ``--jitter``). Each
repetition draws one drift and runs the study twice on it, through ``run_study`` with the
replay launcher, each into a database of its own: ``single`` (``search.confirm: 0``, the
single pass names the best) and ``confirmed`` (``search.confirm`` as given, default 3).

Printed per arm: how often the named best is the true best (100 ms) and within 2% of it
(the true best or the 101.5 ms runner-up), the mean regret (the named best's true step
time over the true best's, minus 1); for the confirmation round, its mean launches and how
often it called the verdict distinguishable and how often the device budget ended it.
Goals: the true best named at least 85% of the time with at most 12.75 confirmation
launches per study (half of the 6-round sign test's 25.5). Nothing is asserted.

    python benchmarks/confirmation_drift.py                 # 20 repetitions, about 20 s
    python benchmarks/confirmation_drift.py --reps 5 --walk 0.03 --jitter 0.01 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.launchers import make_launcher  # noqa: E402
from autotune.runner.study import run_study  # noqa: E402
from autotune.spec import parse_study  # noqa: E402
from autotune.storage import open_storage  # noqa: E402

HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
          "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n")
ROWS = [  # gpus, gb, mb, tp, dp, pp, ms
    (4, 8, 1, 2, 2, 1, 100.0), (4, 8, 2, 2, 2, 1, 101.5), (4, 8, 1, 4, 1, 1, 103.0),
    (4, 8, 2, 4, 1, 1, 104.0), (4, 8, 1, 1, 4, 1, 108.0), (4, 8, 2, 1, 4, 1, 115.0),
    (4, 8, 1, 1, 2, 2, 125.0), (4, 8, 1, 1, 1, 4, 140.0)]
TRUE_BEST_MS = min(r[-1] for r in ROWS)
GOAL_TRUE_BEST, GOAL_LAUNCHES = 0.85, 12.75
"""The goal (issue #30): the true best as often as the 6-round sign test named it, at no
more than half its 25.5 launches per study."""
GOAL_BUDGET = 2.0
"""The benchmark's default ``search.confirm_budget``: what the goal's launches cost in
replayed runs of the search's price (docs/benchmarks.md has 1.0-3.0 beside it)."""


def _drift(rng: random.Random, keys: list[str], answers: int, walk: float,
           jitter: float) -> list[dict[str, Any]]:
    level, common = 0.0, []
    for _ in range(answers):
        common.append(math.exp(level))
        level += rng.gauss(0.0, walk)
    rules = [{"layout": "*", "factors": [round(f, 6) for f in common]}]
    rules += [{"layout": k, "factors": [round(math.exp(rng.gauss(0.0, jitter)), 6)
                                        for _ in range(answers)]} for k in keys]
    return rules


def _doc(directory: Path, name: str, confirm: int, drift: list[dict[str, Any]],
         budget: float | None = None, max_rounds: int | None = None) -> dict[str, Any]:
    return {"name": name,
            "model": {"n_layer": 12, "hidden": 1024, "n_head": 16, "seq_len": 1024,
                      "attention": "explicit"},
            "cluster": {"nodes": 1, "devices_per_node": 4, "device": "a100-80gb"},
            "training": {"global_batch": 8, "dtype": "bf16"},
            "search": {"strategy": "grid", "n_trials": len(ROWS), "confirm": confirm,
                       "learn_from_database": False,
                       **({"confirm_budget": budget} if budget is not None else {}),
                       **({"confirm_max_rounds": max_rounds} if max_rounds else {})},
            "storage": {"url": f"sqlite:///{directory / (name + '.db')}"},
            "launcher": {"kind": "replay", "run_dir": str(directory / "runs"),
                         "replay": {"landscape": str(directory / "table.csv"),
                                    "drift": drift}}}


def _arm(directory: Path, name: str, confirm: int, drift: list[dict[str, Any]],
         budget: float | None = None, max_rounds: int | None = None) -> dict[str, Any]:
    spec = parse_study(_doc(directory, name, confirm, drift, budget, max_rounds))
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training)
    summary = run_study(spec, open_storage(spec.storage), launcher)
    best = summary.best
    assert best is not None
    table = {m.layout.key(): m.iteration_time_s for m in launcher.group.measurements}
    ms = 1000.0 * float(table[best.user_attrs["layout"]] or 0.0)
    rec = summary.confirmation or {}
    return {"best": best.user_attrs["layout"], "best_ms": ms,
            "launches": rec.get("launches", 0), "state": rec.get("state"),
            "distinguishable": rec.get("distinguishable")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--walk", type=float, default=0.02,
                    help="log-sd of the common factor's step per answer (default 0.02)")
    ap.add_argument("--jitter", type=float, default=0.01,
                    help="log-sd of each layout's own factor per answer (default 0.01)")
    ap.add_argument("--confirm", type=int, default=3)
    ap.add_argument("--confirm-budget", type=float, default=GOAL_BUDGET,
                    help="search.confirm_budget of the confirmed arm (default "
                         f"{GOAL_BUDGET}: the goal's operating point, below). A replayed "
                         "run costs what the table's trial took (launcher.replay.build_s, "
                         "60 s, then its steps) and each is its own launch, so the budget "
                         "binds as it would on a machine whose runs cost alike; the goal's "
                         "12.75 launches of an 8-trial study are about 1.6 searches' worth "
                         "of runs, which the study default (0.25) cannot pay for: there the "
                         "round affords no step and the single pass stands")
    ap.add_argument("--confirm-max-rounds", type=int, default=None,
                    help="search.confirm_max_rounds of the confirmed arm (default: 12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    results: dict[str, list[dict[str, Any]]] = {"single": [], "confirmed": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "table.csv").write_text(HEADER + "\n".join(
            f"{g},{gb},{mb},1024,16,12,1024,{tp},{dp},{pp},{ms}"
            for g, gb, mb, tp, dp, pp, ms in ROWS) + "\n")
        probe = parse_study(_doc(root, "probe", 0, []))
        keys = [lay.key() for lay in make_launcher(
            probe.launcher, probe.model, probe.cluster, probe.training).fixed_layouts() or ()]
        answers = len(ROWS) + 12 * args.confirm + 8
        for rep in range(args.reps):
            drift = _drift(rng, keys, answers, args.walk, args.jitter)
            for arm, confirm in (("single", 0), ("confirmed", args.confirm)):
                results[arm].append(_arm(root, f"{arm}-{rep}", confirm, drift,
                                         args.confirm_budget if confirm else None,
                                         args.confirm_max_rounds if confirm else None))
    out: dict[str, Any] = {"reps": args.reps, "walk": args.walk, "jitter": args.jitter,
                           "confirm_budget": args.confirm_budget,
                           "confirm_max_rounds": args.confirm_max_rounds,
                           "true_best_ms": TRUE_BEST_MS, "arms": {}}
    for arm, rows in results.items():
        n = len(rows)
        summary = {"true_best": sum(r["best_ms"] == TRUE_BEST_MS for r in rows) / n,
                   "within_2pct": sum(r["best_ms"] <= TRUE_BEST_MS * 1.02 for r in rows) / n,
                   "mean_regret": sum(r["best_ms"] / TRUE_BEST_MS - 1.0 for r in rows) / n,
                   "mean_confirm_launches": sum(r["launches"] for r in rows) / n,
                   "distinguishable": sum(bool(r["distinguishable"]) for r in rows) / n,
                   "out_of_budget": sum(r["state"] == "budget" for r in rows) / n}
        out["arms"][arm] = summary
        print(f"{arm:10s} true best {summary['true_best']:.0%}, within 2% "
              f"{summary['within_2pct']:.0%}, mean regret {summary['mean_regret']:.2%}, "
              "confirmation launches "
              f"{summary['mean_confirm_launches']:.1f} per study "
              f"(search: {len(ROWS)}), distinguishable {summary['distinguishable']:.0%}, "
              f"out of budget {summary['out_of_budget']:.0%}")
    confirmed = out["arms"]["confirmed"]
    met = (confirmed["true_best"] >= GOAL_TRUE_BEST
           and confirmed["mean_confirm_launches"] <= GOAL_LAUNCHES)
    out["goal"] = {"true_best": GOAL_TRUE_BEST, "launches": GOAL_LAUNCHES, "met": met}
    print(f"goal: true best >= {GOAL_TRUE_BEST:.0%} at <= {GOAL_LAUNCHES} launches a study "
          f"(confirm budget {args.confirm_budget}): {'met' if met else 'not met'}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
