"""The ground truth's ranks: every point of the space measured side by side, in one launch.

Started under ``torchrun`` by ``benchmarks/vs_deepspeed_autotuner.py`` with ``--points
z0-mb1,z1-mb4,...``, ``--global-batch``, ``--rounds R`` and ``--steps S``. It builds one
DeepSpeed engine per point (``examples/deepspeed_gpt/train.py``'s model, data and step,
imported from it, each engine on its own copy of the model from the same seed), then runs
R rounds; in each round every point in turn, in a new random order, runs S optimizer
steps, timed between barriers like ``train.py``'s. Points measured this close together see
the same load: a drift of the machine moves all of them, which separate launches minutes
apart do not (issue #24: one point's repeats differed 2.6x across launches).

Rank 0 prints one line per point and round: ``truth z1-mb4 round 2 step_s 0.0812 0.0799
...`` (the first step of a point's first round is its warm-up and is printed as well; the
benchmark drops it).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "deepspeed_gpt"))
from train import Block, Embed, Head, batch, loss_fn


def parse_point(key: str) -> tuple[int, int]:
    """``z1-mb4`` -> (zero stage 1, micro-batch 4).

    >>> parse_point("z2-mb8")
    (2, 8)
    """
    zero, mb = key.split("-")
    return int(zero.removeprefix("z")), int(mb.removeprefix("mb"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--order-seed", type=int, default=0)
    a = p.parse_args()
    model = argparse.Namespace(layers=2, hidden=64, heads=4, ffn=256, seq_len=64, vocab=256,
                               lr=3e-4, seed=0)
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    engines: dict[str, tuple[Any, argparse.Namespace]] = {}
    for key in a.points.split(","):
        zero, mb = parse_point(key)
        ga = a.global_batch // (mb * world)
        torch.manual_seed(model.seed)
        module = nn.Sequential(Embed(model), *[Block(model) for _ in range(model.layers)],
                               Head(model))
        config = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga,
                  "train_batch_size": mb * ga * world, "zero_optimization": {"stage": zero},
                  "steps_per_print": 10**9}
        engine, *_ = deepspeed.initialize(model=module, config=config,
                                          optimizer=torch.optim.AdamW(module.parameters(),
                                                                      lr=model.lr))
        engines[key] = (engine, argparse.Namespace(**vars(model), micro_batch_size=mb,
                                                   grad_accum=ga))
    order = list(engines)
    shuffle = random.Random(a.order_seed)  # the same order on every rank
    step_of = dict.fromkeys(order, 0)
    for rnd in range(1, a.rounds + 1):
        shuffle.shuffle(order)
        for key in order:
            engine, args = engines[key]
            times = []
            for _ in range(a.steps):
                step_of[key] += 1
                micro = batch(args, step_of[key], rank, world)
                dist.barrier()
                start = time.perf_counter()
                for inputs, labels in micro:
                    engine.backward(loss_fn(engine(inputs), labels))
                    engine.step()
                dist.barrier()
                times.append(time.perf_counter() - start)
            if rank == 0:
                print(f"truth {key} round {rnd} step_s " + " ".join(f"{t:.6f}" for t in times),
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
