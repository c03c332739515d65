"""How many trials `autotune run` needs where the cost model is right (or nearly).

A search that cannot find the best layout quickly when the cost model is right will not
do better on a real table. This benchmark builds synthetic tables from the cost model
itself: for each GPT shape and cluster size, every (tp, pp, micro-batch) layout of the
space is "measured" at its predicted model TFLOPS times ``exp(N(0, noise))`` (a
per-layout error), and runs out of memory where the memory model's peak (the mean of the
two stacks Megatron-DeepSpeed may run, as for a vTrain table) exceeds the usable memory.
Each table is replayed by the study runner itself (``benchmarks/_study_run.study_run``:
the replay launcher, the memory check on, the default strategy), and the trials to reach
2% of the table's best are counted.

    python benchmarks/search_self_consistency.py                # noise 0, 0.05, 0.1
    python benchmarks/search_self_consistency.py --noise 0.05 --draws 8

The shapes are GPT-3's 1.3B-12B family on 4-16 DGX A100 80GB nodes (full recompute,
Megatron's explicit attention and dropout, as in the vTrain tables): where data
parallelism is fastest but its memory is doubtful, and where a model-parallel layout is.
Nothing here is fitted: the tables are the model's own figures.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.hardware import GiB
from autotune.landscape import LandscapeGroup, Measurement
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.models.memory import estimate_memory
from autotune.models.stacks import EITHER, EITHER_STACKS
from benchmarks._study_run import study_run

SHAPES = ((2048, 16, 24), (2560, 32, 32), (3072, 32, 30), (4096, 32, 36), (5120, 40, 40))
"""(hidden, heads, layers): GPT-3's 1.3B, 2.7B, 3.6B (Megatron's), 6.7B and 13B-like."""
SIZES = ((4, 256), (8, 512), (16, 1024))
"""(nodes of 8 A100 80GB, global batch)."""
USABLE = 0.95 * 80 * GiB
"""The device's memory less the study's default 5% margin (``trial.memory_margin``)."""
TOLERANCE = 0.02


def table(model: ModelConfig, nodes: int, global_batch: int, noise: float,
          rng: random.Random) -> LandscapeGroup:
    """The synthetic table of ``model`` on ``nodes`` nodes (module docstring)."""
    cluster = ClusterConfig(nodes=nodes, devices_per_node=8, device="a100-80gb")
    world, rows = nodes * 8, []
    for tp, pp, mb in itertools.product((1, 2, 4, 8), repeat=3):
        if world % (tp * pp) or model.n_layer % pp:
            continue
        dp = world // (tp * pp)
        if global_batch % (dp * mb):
            continue
        lay = Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb,
                     grad_accum=global_batch // (dp * mb), recompute="full")
        peak = statistics.fmean(
            estimate_memory(model, lay, dtype="bf16", device=cluster.device,
                            stack=stack).peak_bytes for stack in EITHER_STACKS)
        if peak > USABLE:
            rows.append(Measurement(lay, "oom", None, None))
            continue
        value = estimate_step(model, lay, cluster, dtype="bf16",
                              stack=EITHER_STACKS[0]).model_tflops_per_device
        rows.append(Measurement(lay, "ok", value * math.exp(rng.gauss(0.0, noise)), None))
    name = f"h{model.hidden}-l{model.n_layer}-{nodes}x8-gb{global_batch}"
    return LandscapeGroup(name, model, cluster, global_batch, "bf16", tuple(rows),
                          stack=EITHER)


def trials_to_hit(group: LandscapeGroup, budget: int) -> int | None:
    """Trials of the runner until one is within :data:`TOLERANCE` of the table's best."""
    best = max(m.model_tflops_per_device or 0.0 for m in group.measurements)
    for i, trial in enumerate(study_run(group, "default", seed=0, n_trials=budget,
                                        study_check=True), 1):
        if trial.value is not None and trial.value >= (1.0 - TOLERANCE) * best:
            return i
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--noise", type=float, action="append",
                    help="per-layout error sd of the log (repeatable; default 0, 0.05, 0.1)")
    ap.add_argument("--draws", type=int, default=4, help="tables per shape and size")
    ap.add_argument("--budget", type=int, default=12, help="trials per study")
    ap.add_argument("--verbose", action="store_true", help="one line per table")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # the runner's per-trial lines
    noises = args.noise or [0.0, 0.05, 0.1]
    print(f"{'noise':>6} {'tables':>6} {'<=1':>4} {'<=2':>4} {'<=4':>4} {'<=8':>4} "
          f"{'<=' + str(args.budget):>5} {'median':>6} {'mean*':>6} {'worst':>6}")
    for noise in noises:
        start, hits = time.perf_counter(), []
        draws = 1 if noise == 0 else args.draws
        for (h, a, layers), (nodes, gb), draw in itertools.product(SHAPES, SIZES,
                                                                    range(draws)):
            model = ModelConfig(n_layer=layers, hidden=h, n_head=a, seq_len=2048,
                                attention="explicit", dropout=0.1)
            group = table(model, nodes, gb, noise, random.Random(draw * 7919 + nodes))
            hit = trials_to_hit(group, args.budget)
            hits.append(hit)
            if args.verbose:
                print(f"  {group.name}: {hit if hit else 'missed'}")
        capped = [h if h is not None else args.budget + 1 for h in hits]
        within = [sum(c <= k for c in capped) for k in (1, 2, 4, 8, args.budget)]
        worst = "miss" if None in hits else str(max(capped))
        print(f"{noise:>6.2f} {len(hits):>6} " + " ".join(f"{w:>4}" for w in within[:4])
              + f" {within[4]:>5} {statistics.median(capped):>6.1f} "
              f"{statistics.fmean(capped):>6.2f} {worst:>6}   "
              f"({time.perf_counter() - start:.0f} s)")
    print(f"trials to reach {TOLERANCE:.0%} of the table's best, through the study runner "
          f"(default strategy, memory check on); mean*: a miss counts {args.budget + 1}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
