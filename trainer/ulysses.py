"""DeepSpeed-Ulysses in the built-in trainer (Jacobs et al. 2023): the sequence split over
``u = layout.ulysses`` ranks, all-to-all around attention.

Rank order as Megatron-DeepSpeed's ``initialize_model_parallel`` at ``tp = pp = 1`` (the
only place Ulysses is feasible: :mod:`autotune.feasibility.strategies`): the ``u`` ranks of one
sequence group are consecutive, ``rank = dp_rank * u + sp_rank``; the data-parallel groups
are the ranks ``u`` apart; ZeRO and the gradient reduction span all ``dp * u`` ranks
(DeepSpeed's sequence-data-parallel group, which it takes from the ``mpu``:
``deepspeed/utils/groups.py``, ``_get_sequence_data_parallel_group``).

Each rank embeds its ``s / u`` positions (position embeddings at its offset);
``deepspeed.sequence.layer.DistributedAttention`` turns its queries, keys and values of
``s / u`` positions and all heads into all ``s`` positions of ``heads / u`` heads, runs the
layer's own (causal) attention, and turns the output back; everything else is position-wise.
Each rank's loss is the mean over its positions, so the mean over the ``u`` ranks, which
DeepSpeed's gradient averaging over the sequence-data-parallel group forms, is the full
sequence's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["UlyssesContext", "UlyssesMpu", "ulysses_groups", "shard_sequence",
           "distributed_attention"]


@dataclass
class UlyssesContext:
    """This rank's place in its sequence-parallel group."""

    rank: int
    size: int
    group: Any

    def positions(self, seq_len: int) -> slice:
        """The positions of the full sequence this rank holds."""
        per = seq_len // self.size
        return slice(self.rank * per, (self.rank + 1) * per)


class UlyssesMpu:
    """The ``mpu`` DeepSpeed reads its groups from (the methods it calls, as Megatron's
    ``parallel_state`` names them): tensor/model parallelism of one rank, data parallelism
    over the ranks ``u`` apart, sequence parallelism over ``u`` consecutive ranks."""

    def __init__(self, ctx: UlyssesContext, dp_group: Any, dp_rank: int, dp_size: int,
                 seq_dp_group: Any, own_group: Any, *, zero3: bool = False):
        self.ctx, self.dp_group, self.dp_rank, self.dp_size = ctx, dp_group, dp_rank, dp_size
        self.seq_dp_group, self.own_group, self.zero3 = seq_dp_group, own_group, zero3

    def get_data_parallel_group(self) -> Any:
        """The data-parallel ranks; under ZeRO-3 the sequence-data-parallel ones. DeepSpeed
        partitions a model not built under ``zero.Init`` over this group
        (``deepspeed/runtime/zero/parameter_offload.py`` line 268, ``Init(module=module,
        data_parallel_group=mpu.get_data_parallel_group())``, 0.19.8) and reduces each
        parameter's gradient in its partition group: over the plain data-parallel ranks the
        sequence ranks' gradients were never summed (the losses drifted by 2e-3 at the
        second step). The batch arithmetic keeps ``dp`` (:meth:`get_data_parallel_world_size`)."""
        return self.seq_dp_group if self.zero3 else self.dp_group

    def get_data_parallel_world_size(self) -> int:
        return self.dp_size

    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def get_model_parallel_group(self) -> Any:
        return self.own_group

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_tensor_model_parallel_src_rank(self) -> int:
        return dist.get_rank()

    def get_sequence_parallel_group(self) -> Any:
        return self.ctx.group

    def get_sequence_parallel_world_size(self) -> int:
        return self.ctx.size

    def get_sequence_parallel_rank(self) -> int:
        return self.ctx.rank

    def get_sequence_data_parallel_group(self) -> Any:
        return self.seq_dp_group

    def get_sequence_data_parallel_world_size(self) -> int:
        return self.ctx.size * self.dp_size

    def get_sequence_data_parallel_rank(self) -> int:
        return dist.get_rank(self.seq_dp_group)


def ulysses_groups(ulysses: int, dp: int, *, zero3: bool = False
                   ) -> tuple[UlyssesContext, UlyssesMpu]:
    """Every rank's groups (``new_group`` is collective: all ranks create all groups in the
    same order); this rank's context and mpu."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine: dict[str, Any] = {}
    for g in range(dp):
        group = dist.new_group(list(range(g * ulysses, (g + 1) * ulysses)))
        if rank // ulysses == g:
            mine["sp"] = group
    for s in range(ulysses):
        group = dist.new_group(list(range(s, world, ulysses)))
        if rank % ulysses == s:
            mine["dp"] = group
    for r in range(world):
        group = dist.new_group([r])
        if r == rank:
            mine["own"] = group
    ctx = UlyssesContext(rank=rank % ulysses, size=ulysses, group=mine["sp"])
    mpu = UlyssesMpu(ctx, mine["dp"], rank // ulysses, dp, dist.group.WORLD, mine["own"],
                     zero3=zero3)
    return ctx, mpu


def shard_sequence(inputs: torch.Tensor, labels: torch.Tensor,
                   ctx: UlyssesContext) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's positions of a micro-batch's ``[b, s]`` inputs and labels."""
    cut = ctx.positions(inputs.shape[1])
    return inputs[:, cut].contiguous(), labels[:, cut].contiguous()


def distributed_attention(core: Callable[..., torch.Tensor],
                          ctx: UlyssesContext) -> Callable[..., torch.Tensor]:
    """``core`` (``[b, heads, s, d]`` in and out, then the dropout count) behind DeepSpeed's
    all-to-alls: the result takes and returns ``[b, s / u, heads, d]`` (``batch_dim_idx =
    0``: heads scattered, ``scatter_idx = 2``; positions gathered, ``gather_idx = 1``). The
    count travels as a keyword: DistributedAttention hands keywords through to the local
    attention, and its next positional parameter is ``rotary_pos_emb``."""
    from deepspeed.sequence.layer import DistributedAttention

    def local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              count: int = 0) -> torch.Tensor:
        out = core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), count)
        return out.transpose(1, 2)

    layer = DistributedAttention(_Local(local), ctx.group, scatter_idx=2, gather_idx=1)
    return lambda q, k, v, count=0: layer(q, k, v, 0, count=count)


class _Local(torch.nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                count: int = 0) -> torch.Tensor:
        return self.fn(q, k, v, count)
