"""The DeepSpeed engine of one trial and its training step.

One topology, ``PipeModelDataParallelTopology(num_pp, num_mp, num_dp)``, for every
layout (axes ``pipe, data, model``: TP ranks consecutive, see :mod:`autotune.layout`).

* ``pp > 1``: a ``PipelineModule`` in DeepSpeed's ``PipelineEngine``; ``train_batch``
  runs the 1F1B schedule over ``grad_accum`` micro-batches. ZeRO 0-1 only.
* ``pp = 1``: the same layers in :class:`trainer.model.GPT` under the plain
  ``DeepSpeedEngine`` with a ``PipelineParallelGrid`` as its ``mpu`` (so the groups come
  from the same topology). Measured the simpler of the two: the plain engine is what
  ZeRO-2/3 need anyway, and a one-stage PipelineEngine refuses them.

The optimizer is ``torch.optim.AdamW`` (``"torch_adam": true``): DeepSpeed's FusedAdam
JIT-compiles for minutes on CPU and needs icpx on XPU. Gradient clipping is off: a
throughput trial does not need it, and DeepSpeed's fp32 norm helper counts a pipeline
stage's replicated parameters only on the replica's first rank.
"""

from __future__ import annotations

import gc
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

from autotune.config.model import ModelConfig
from autotune.dsconfig import LEARNING_RATE, deepspeed_config
from autotune.layout import Layout
from autotune.trial import RunConfig
from trainer.distributed import DeviceInfo
from trainer.model import GPT, LossFn
from trainer.pipeline import build_pipeline_module
from trainer.tp_context import TPContext
from trainer.ulysses import shard_sequence, ulysses_groups
from trainer.zero_variants import check_zero3_variant, zero3_variant_init

__all__ = ["TrainEngine", "LEARNING_RATE"]


class TrainEngine:
    """A built model + optimizer for one layout; :meth:`step` runs one optimizer step."""

    def __init__(self, model: ModelConfig, layout: Layout, run: RunConfig, device: DeviceInfo):
        rank = dist.get_rank()
        self.layout = layout
        self.topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp,
                                                      num_dp=layout.zero_group)
        coord = self.topology.get_coord(rank)
        self.dp_rank: int = coord.data
        self.tp = TPContext(rank=coord.model, size=layout.tp,
                            sequence_parallel=layout.sequence_parallel)
        recompute = layout.recompute
        config = deepspeed_config(layout, run.dtype)
        self.device = device
        if layout.pp > 1:
            module: torch.nn.Module = build_pipeline_module(model, self.topology, self.tp,
                                                           seed=run.seed, recompute=recompute)
            self.n_params_local = _count(module)
            self.engine, *_ = deepspeed.initialize(
                model=module, model_parameters=[p for p in module.parameters()], config=config)
        else:
            grid: Any = PipelineParallelGrid(topology=self.topology)
            self.tp.group = grid.get_slice_parallel_group()
            self.dp_group = grid.get_data_parallel_group()
            if layout.ulysses > 1:  # tp = pp = 1: the sequence groups replace the grid's
                self.tp.ulysses, grid = ulysses_groups(layout.ulysses, layout.dp,
                                                       zero3=layout.zero_stage == 3)
                self.dp_rank, self.dp_group = grid.dp_rank, grid.seq_dp_group
            with zero3_variant_init(layout, config, self.dp_group):
                module = GPT(model, self.tp, run.seed, recompute=recompute)
            self.n_params_local = _count(module)
            self.loss_fn = LossFn(model, self.tp)
            self.engine, *_ = deepspeed.initialize(
                model=module, model_parameters=[p for p in module.parameters()],
                config=config, mpu=grid)
            check_zero3_variant(self.engine, layout)

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """One optimizer step; returns the global-batch mean loss (same on every rank)."""
        if self.layout.pp > 1:
            # train_batch averages over micro-batches and data-parallel ranks and
            # broadcasts the result from the last stage to the whole pipeline.
            return float(self.engine.train_batch(iter(micro_batches)))
        total = torch.zeros((), dtype=torch.float32, device=self.device.torch_device)
        for inputs, labels in micro_batches:
            if self.tp.ulysses is not None:
                inputs, labels = shard_sequence(inputs, labels, self.tp.ulysses)
            logits = self.engine(inputs.to(self.device.torch_device))
            loss = self.loss_fn(logits, labels.to(self.device.torch_device))
            self.engine.backward(loss)
            self.engine.step()  # steps the optimizer only at the accumulation boundary
            total += loss.detach().float()
        total /= len(micro_batches)
        if self.layout.zero_group > 1:  # with Ulysses over the sequence ranks too
            dist.all_reduce(total, group=self.dp_group)
            total /= self.layout.zero_group
        return float(total)

    def close(self) -> None:
        """Free the engine (several trials may run in one process)."""
        destroy = getattr(self.engine, "destroy", None)
        if callable(destroy):
            destroy()
        del self.engine
        gc.collect()


def _count(module: torch.nn.Module) -> int:
    # Counted before deepspeed.initialize: with ZeRO-3 the engine partitions them later,
    # but what a rank *owns by layout* (its TP shard of its PP stage) is this count.
    # Built under MiCS_Init a parameter is already partitioned: ds_numel is its full size.
    return sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())
