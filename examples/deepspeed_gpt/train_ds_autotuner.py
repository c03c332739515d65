"""``train.py``'s GPT, launched the way DeepSpeed's Autotuner launches a program.

DeepSpeed's Autotuner (``deepspeed --autotuning tune``) starts the tuned script once per
experiment under the ``deepspeed`` launcher with two arguments of its own: the literal flag
``--deepspeed_config`` followed by the experiment's config, base64-encoded
(``deepspeed/autotuning/scheduler.py``, ``run_experiment``: ``user_args[idx + 1] =
exp["ds_config_base64"]``), and ``--local_rank``. The batch (``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``) and the ZeRO stage are the config's, not flags: this is
what differs from ``train.py``, which takes them as flags. The model, the data and the step
are ``train.py``'s own (imported from it), so both tools tune the same program.

With the config's ``autotuning.enabled`` the engine ends the process itself after its
``end_profile_step`` (``deepspeed/runtime/engine.py``, ``_autotuning_exit``, at
``global_steps == end_profile_step + 1``): ``--steps`` must be larger (default 10; the
autotuner's default end step is 5). Run by hand, e.g.::

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 examples/deepspeed_gpt/train_ds_autotuner.py \\
        --deepspeed_config ds_config.json --steps 10

``--deepspeed_config`` takes a path or the base64 text; DeepSpeed's own config loader reads
both (``deepspeed/runtime/config.py``, ``DeepSpeedConfig.__init__``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import time
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from autotune_metrics import MetricsWriter
from torch import nn
from train import Block, Embed, Head, add_model_args, batch, loss_fn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deepspeed_config", required=True,
                   help="DeepSpeed config: a JSON file or its base64 text (the autotuner's)")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (>= 6 under the "
                   "autotuner: it ends the run at its end_profile_step + 1)")
    add_model_args(p)
    return p.parse_args()


def load_config(text: str) -> dict[str, Any]:
    """The config from a path or from the autotuner's URL-safe base64 text.

    >>> load_config(base64.urlsafe_b64encode(b'{"train_batch_size": 16}').decode())
    {'train_batch_size': 16}
    """
    if os.path.exists(text):
        with open(text, encoding="utf-8") as fh:
            return dict(json.load(fh))
    try:
        return dict(json.loads(base64.urlsafe_b64decode(text).decode("utf-8")))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SystemExit(f"--deepspeed_config: {text[:60]!r} is neither a file nor base64 "
                         f"JSON ({err})") from None


def main() -> None:
    a = parse_args()
    torch.manual_seed(a.seed)
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = load_config(a.deepspeed_config)
    # The batch is the config's; train.py's data helper reads it from these two names.
    a.micro_batch_size = int(config["train_micro_batch_size_per_gpu"])
    a.grad_accum = int(config.get("gradient_accumulation_steps", 1))
    module = nn.Sequential(Embed(a), *[Block(a) for _ in range(a.layers)], Head(a))
    optimizer = torch.optim.AdamW(module.parameters(), lr=a.lr)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    metrics = MetricsWriter()
    tokens_per_step = a.micro_batch_size * a.grad_accum * world * a.seq_len
    for step in range(1, a.steps + 1):
        micro = batch(a, step, rank, world)
        dist.barrier()
        start = time.perf_counter()
        total = 0.0
        for inputs, labels in micro:
            out = loss_fn(engine(inputs), labels)
            engine.backward(out)
            engine.step()  # under the autotuner this exits after its end_profile_step
            total += out.item()
        dist.barrier()
        seconds = time.perf_counter() - start
        if rank == 0:
            print(f"step {step}/{a.steps} | time {seconds:.6f} s | loss {total / len(micro):.4f}",
                  flush=True)
        metrics.step(step, seconds, tokens=tokens_per_step, loss=total / len(micro))
    metrics.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
