"""A small GPT trained with plain DeepSpeed: the kind of program autotune tunes as it is.

Nothing here knows about autotune. It is launched one process per device, e.g.::

    torchrun --nproc-per-node 2 examples/deepspeed_gpt/train.py \\
        --deepspeed-config ds_config.json --micro-batch-size 2 --grad-accum 4 \\
        --zero-stage 1 --pipeline-stages 1 --steps 20

Data parallelism is what is left of the ranks after the pipeline: ``dp = world /
pipeline-stages``. ``--pipeline-stages 1`` trains the whole model under DeepSpeed's engine
(any ZeRO stage); more stages cut it with DeepSpeed's ``PipelineModule`` (ZeRO 0-1). The
flags decide the batch, the accumulation and the ZeRO stage; ``--deepspeed-config`` (optional)
gives everything else, and its batch and ZeRO keys are overwritten by the flags.

Each step is timed between two barriers and printed by rank 0 (``step 3/20 | time
0.412345 s | loss 5.5312``). If ``AUTOTUNE_METRICS_FILE`` is set (autotune sets it for every
trial) the same timings also go to that file, through ``autotune_metrics.py``, a copy of
``autotune/metrics_writer.py`` kept next to this script.

On CPU (``DS_ACCELERATOR=cpu``, gloo), DeepSpeed compiles its shared-memory all-reduce op the
first time it initialises (about a minute, then cached in ``~/.cache/torch_extensions``).
"""

from __future__ import annotations

import argparse
import json
import time

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from autotune_metrics import MetricsWriter
from deepspeed.pipe import LayerSpec, PipelineModule
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deepspeed-config", help="DeepSpeed JSON config (batch and ZeRO keys: "
                   "from the flags)")
    p.add_argument("--micro-batch-size", type=int, required=True)
    p.add_argument("--grad-accum", type=int, required=True)
    p.add_argument("--zero-stage", type=int, default=0)
    p.add_argument("--pipeline-stages", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    add_model_args(p)
    return p.parse_args()


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model's and the optimizer's flags (also train_ds_autotuner.py's)."""
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)


class Embed(nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.tokens = nn.Embedding(a.vocab, a.hidden)
        self.positions = nn.Parameter(torch.randn(a.seq_len, a.hidden) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tokens(x) + self.positions[: x.shape[1]]


class Block(nn.Module):
    """Pre-LayerNorm attention + GELU MLP: the matmuls autotune's FLOPs formula counts."""

    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.heads = a.heads
        self.ln1, self.ln2 = nn.LayerNorm(a.hidden), nn.LayerNorm(a.hidden)
        self.qkv, self.proj = nn.Linear(a.hidden, 3 * a.hidden), nn.Linear(a.hidden, a.hidden)
        self.fc1, self.fc2 = nn.Linear(a.hidden, a.ffn), nn.Linear(a.ffn, a.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(a.hidden)
        self.out = nn.Linear(a.hidden, a.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def batch(a: argparse.Namespace, step: int, dp_rank: int, dp: int) -> list[tuple[torch.Tensor,
                                                                                  torch.Tensor]]:
    """This replica's micro-batches of step ``step`` (the global batch is drawn first, so
    every layout trains on the same tokens)."""
    gen = torch.Generator().manual_seed(a.seed * 100_003 + step)
    total = a.micro_batch_size * a.grad_accum * dp
    tokens = torch.randint(0, a.vocab, (total, a.seq_len + 1), generator=gen)
    mine = tokens.view(a.grad_accum, dp, a.micro_batch_size, -1)[:, dp_rank]
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in mine]


def main() -> None:
    a = parse_args()
    torch.manual_seed(a.seed)
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // a.pipeline_stages
    config = json.load(open(a.deepspeed_config)) if a.deepspeed_config else {}
    config.update(train_micro_batch_size_per_gpu=a.micro_batch_size,
                  gradient_accumulation_steps=a.grad_accum,
                  train_batch_size=a.micro_batch_size * a.grad_accum * dp)
    config["zero_optimization"] = {**config.get("zero_optimization", {}), "stage": a.zero_stage}
    layers = [LayerSpec(Embed, a), *[LayerSpec(Block, a) for _ in range(a.layers)],
              LayerSpec(Head, a)]
    if a.pipeline_stages > 1:
        module: nn.Module = PipelineModule(layers=layers, num_stages=a.pipeline_stages,
                                           loss_fn=loss_fn, partition_method="uniform")
    else:
        module = nn.Sequential(*[spec.build() for spec in layers])
    optimizer = torch.optim.AdamW(module.parameters(), lr=a.lr)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    dp_rank = engine.grid.get_data_parallel_rank() if a.pipeline_stages > 1 else rank
    metrics = MetricsWriter()
    tokens_per_step = a.micro_batch_size * a.grad_accum * dp * a.seq_len
    for step in range(1, a.steps + 1):
        micro = batch(a, step, dp_rank, dp)
        dist.barrier()
        start = time.perf_counter()
        if a.pipeline_stages > 1:
            loss = float(engine.train_batch(iter(micro)))
        else:
            total = 0.0
            for inputs, labels in micro:
                out = loss_fn(engine(inputs), labels)
                engine.backward(out)
                engine.step()
                total += out.item()
            loss = total / len(micro)
        dist.barrier()
        seconds = time.perf_counter() - start
        if rank == 0:
            print(f"step {step}/{a.steps} | time {seconds:.6f} s | loss {loss:.4f}", flush=True)
        metrics.step(step, seconds, tokens=tokens_per_step, loss=loss)
    metrics.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
