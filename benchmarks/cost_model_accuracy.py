"""How well does the analytic cost model rank measured layouts?

For every landscape group with at least ``--min-layouts`` measured (``ok``) layouts, the
Spearman rank correlation between predicted and measured model TFLOPS per device, and
whether the measured best is among the predicted top 3. OOM rows are left out of the
correlation; the memory model's verdict on them is reported (``oom_flagged``).

    python benchmarks/cost_model_accuracy.py \\
        --landscape ../shared/landscapes/vtrain_a100_single_node.csv \\
        --landscape ../shared/landscapes/aurora_pvc_70b.csv --json accuracy.json

Attention: the vTrain runs (Megatron-DeepSpeed, 2022-23) used Megatron's fused softmax,
which materialises the score matrix; the Aurora runs and our trainer use flash / SDPA
attention. The loader sets ``model.attention`` by format; ``--attention`` overrides it.
Nothing here is fitted to the files: the model's constants are physical (docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from autotune.config.model import ATTENTION_KINDS
from autotune.feasibility import MemoryBudget, check_layout
from autotune.landscape import LandscapeGroup, load_landscape
from autotune.models.cost import estimate_step


def average_ranks(values: list[float]) -> np.ndarray:
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


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks (NaN if constant)."""
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _flagged(group: LandscapeGroup, margin: float, status: str = "oom") -> int:
    """Rows of ``status`` that the memory model predicts do not fit the device."""
    spec = group.cluster.device_spec()
    budget = MemoryBudget(spec.memory_bytes, margin=margin, dtype=group.dtype,
                          device=group.cluster.device)
    return sum(1 for m in group.measurements if m.status == status
               and any(r.code == "memory"
                       for r in check_layout(m.layout, group.model, memory=budget)))


def evaluate_group(group: LandscapeGroup, *, margin: float) -> dict:
    ok = group.ok()
    if not ok:
        return {"name": group.name, "n_layouts": 0, "spearman": None, "best_in_top3": False,
                "n_oom": sum(m.status == "oom" for m in group.measurements),
                "oom_flagged": _flagged(group, margin), "ok_flagged_infeasible": 0}
    predicted = [estimate_step(group.model, m.layout, group.cluster,
                               dtype=group.dtype).model_tflops_per_device for m in ok]
    measured = [float(m.model_tflops_per_device or 0.0) for m in ok]
    best = int(np.argmax(measured))
    top3 = sorted(range(len(ok)), key=lambda i: -predicted[i])[:3]
    ooms = [m for m in group.measurements if m.status == "oom"]
    return {
        "name": group.name, "n_layouts": len(ok),
        "spearman": spearman(predicted, measured) if len(ok) >= 2 else None,
        "best_in_top3": best in top3,
        "measured_best": ok[best].layout.key(),
        "predicted_best": ok[top3[0]].layout.key(),
        "n_oom": len(ooms), "oom_flagged": _flagged(group, margin),
        "ok_flagged_infeasible": _flagged(group, margin, status="ok"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--landscape", action="append", required=True, metavar="FILE")
    p.add_argument("--hardware", metavar="NAME", help="device name where the file lacks it")
    p.add_argument("--devices-per-node", type=int, metavar="N")
    p.add_argument("--vocab-size", type=int, default=51200, metavar="N")
    p.add_argument("--min-layouts", type=int, default=8, metavar="N")
    p.add_argument("--attention", choices=ATTENTION_KINDS,
                   help="override the file's attention kind (default: vTrain explicit, "
                        "Aurora flash)")
    p.add_argument("--memory-margin", type=float, default=0.05,
                   help="as trial.memory_margin (default 0.05)")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)

    groups, oom_total, oom_flagged, ok_total, ok_flagged = [], 0, 0, 0, 0
    for path in args.landscape:
        for g in load_landscape(path, hardware=args.hardware,
                                devices_per_node=args.devices_per_node,
                                vocab_size=args.vocab_size, attention=args.attention):
            res = evaluate_group(g, margin=args.memory_margin)
            oom_total += res["n_oom"]
            oom_flagged += res["oom_flagged"]
            ok_total += sum(m.status == "ok" for m in g.measurements)
            ok_flagged += res["ok_flagged_infeasible"]
            if res["n_layouts"] >= args.min_layouts:
                groups.append(res)

    rhos = [g["spearman"] for g in groups if g["spearman"] is not None
            and not np.isnan(g["spearman"])]
    median = float(np.median(rhos)) if rhos else None
    misses = [g["name"] for g in groups if not g["best_in_top3"]]
    print(f"{'group':50s} {'n':>4s} {'spearman':>9s} {'top3':>5s}  measured best / predicted")
    for g in groups:
        rho = "nan" if g["spearman"] is None else f"{g['spearman']:.3f}"
        print(f"{g['name']:50s} {g['n_layouts']:4d} {rho:>9s} {g['best_in_top3']!s:>5s}  "
              f"{g['measured_best']} / {g['predicted_best']}")
    print(f"\ngroups with >= {args.min_layouts} layouts: {len(groups)}; median Spearman "
          f"{median if median is None else round(median, 4)}; measured best in predicted "
          f"top 3: {len(groups) - len(misses)}/{len(groups)}")
    print(f"OOM rows: {oom_total}, predicted infeasible by the memory model: {oom_flagged}")
    # The other side of the memory model's accuracy: rows that ran but are predicted not to.
    print(f"ok rows: {ok_total}, predicted infeasible by the memory model: {ok_flagged}")
    if args.json:
        out = {"median_spearman": median, "groups": groups,
               "n_groups": len(groups), "top3_misses": misses,
               "oom_rows": oom_total, "oom_flagged": oom_flagged,
               "ok_rows": ok_total, "ok_flagged_infeasible": ok_flagged}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
