"""Megatron-style tensor parallelism: autograd collectives, parallel layers, parallel loss.

Shoeybi et al. 2019 (Megatron-LM, section 3, fig. 3): the first linear of a pair is split
by output columns (no communication in forward), the second by input rows (one
all-reduce in forward); the backward mirrors it. The embedding and the output layer are
split over the vocabulary, and the cross-entropy is computed on the vocabulary shards
without gathering the logits (Megatron's ``vocab_parallel_cross_entropy``).

The process group is carried by a :class:`TPContext` passed to every layer (no module
globals). With ``size == 1`` every collective is the identity, so the same layers serve
``tp = 1``.

With ``TPContext.sequence_parallel`` the column-parallel linear takes sequence-sharded input
and the row-parallel one returns it (:mod:`trainer.sequence_parallel`, Korthikanti et al.
2022, section 4.2.2).

Initialisation is layout-independent: each layer draws its *full* weight from a generator
seeded by the layer's index and keeps its shard, so ``tp = 1`` and ``tp = 4`` start from
the same model and their losses can be compared.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.sequence_parallel import gathered_linear, reduce_scatter_to_sequence, sum_grad_over_tp
from trainer.tp_context import TPContext

__all__ = ["TPContext", "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "copy_to_tp",
           "reduce_from_tp", "init_normal", "INIT_STD"]

INIT_STD = 0.02
"""GPT-2 initialisation (Radford et al. 2019)."""


def _all_reduce(x: torch.Tensor, ctx: TPContext, op: Any = None) -> torch.Tensor:
    if ctx.size == 1:
        return x
    x = x.contiguous()
    dist.all_reduce(x, op=op or dist.ReduceOp.SUM, group=ctx.group)
    return x


class _CopyToTP(torch.autograd.Function):
    """Forward identity, backward all-reduce (Megatron's ``f`` operator)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad.clone(), ctx.tp), None


class _ReduceFromTP(torch.autograd.Function):
    """Forward all-reduce, backward identity (Megatron's ``g`` operator)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:
        return _all_reduce(x.clone(), tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return x if tp.size == 1 else _CopyToTP.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp)


def init_normal(shape: tuple[int, ...], generator: torch.Generator,
                std: float = INIT_STD) -> torch.Tensor:
    """A full (unsharded) weight drawn on the CPU, so every layout draws the same numbers."""
    return torch.empty(shape).normal_(0.0, std, generator=generator)


def _mark_sharded(param: nn.Parameter) -> nn.Parameter:
    # DeepSpeed counts such parameters once per TP rank in the gradient norm
    # (deepspeed.runtime.utils.is_model_parallel_parameter).
    param.tensor_model_parallel = True  # type: ignore[attr-defined]
    return param


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with W split by output rows; the output stays sharded.

    ``full_weight`` rows may be grouped (e.g. Q, K, V) with ``row_groups``: each group
    is sharded separately and the shards concatenated, so a rank holds its own heads'
    Q, K and V.
    """

    def __init__(self, full_weight: torch.Tensor, tp: TPContext, *, bias: bool = True,
                 row_groups: tuple[int, ...] | None = None):
        super().__init__()
        self.tp = tp
        groups = row_groups or (full_weight.shape[0],)
        parts, offset = [], 0
        for rows in groups:
            lo, hi = tp.shard(rows)
            parts.append(full_weight[offset + lo: offset + hi])
            offset += rows
        self.weight = _mark_sharded(nn.Parameter(torch.cat(parts).contiguous()))
        self.bias = (_mark_sharded(nn.Parameter(torch.zeros(self.weight.shape[0])))
                     if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.sp:  # x is this rank's sequence shard: gathered here, not stored whole
            return gathered_linear(x, self.weight, self.bias, self.tp)
        return nn.functional.linear(copy_to_tp(x, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with W split by input columns; the partial sums are all-reduced.

    The bias is replicated and added after the reduction (once, not ``tp`` times).
    """

    def __init__(self, full_weight: torch.Tensor, tp: TPContext, *, bias: bool = True):
        super().__init__()
        self.tp = tp
        lo, hi = tp.shard(full_weight.shape[1])
        self.weight = _mark_sharded(nn.Parameter(full_weight[:, lo:hi].contiguous()))
        self.bias = nn.Parameter(torch.zeros(full_weight.shape[0])) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.sp:  # summed and split along the sequence: the bias sees one shard
            y = reduce_scatter_to_sequence(nn.functional.linear(x, self.weight), self.tp)
            return y if self.bias is None else y + sum_grad_over_tp(self.bias, self.tp)
        y = reduce_from_tp(nn.functional.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token embedding split over the (padded) vocabulary; lookups outside the shard
    contribute zeros and one all-reduce assembles the rows."""

    def __init__(self, full_weight: torch.Tensor, tp: TPContext):
        super().__init__()
        self.tp = tp
        self.start, self.stop = tp.shard(full_weight.shape[0])
        self.weight = _mark_sharded(nn.Parameter(full_weight[self.start:self.stop].clone()))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return nn.functional.embedding(tokens, self.weight)
        outside = (tokens < self.start) | (tokens >= self.stop)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = nn.functional.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean token cross-entropy over logits sharded on the last (vocabulary) axis."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, tp: TPContext,
                vocab_start: int) -> torch.Tensor:
        logits = logits.float()
        # Max over the whole vocabulary for a stable softmax.
        logits_max = _all_reduce(logits.max(dim=-1).values, tp, dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)
        n_local = logits.shape[-1]
        local_t = target - vocab_start
        outside = (local_t < 0) | (local_t >= n_local)
        local_t = local_t.masked_fill(outside, 0)
        picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        picked = _all_reduce(picked, tp)
        exp = shifted.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), tp)
        loss = sum_exp.log() - picked
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local_t, outside)
        return loss.mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, local_t, outside = ctx.saved_tensors
        g = softmax.clone()
        onehot = torch.zeros_like(g).scatter_(-1, local_t.unsqueeze(-1), 1.0)
        g -= onehot * (~outside).unsqueeze(-1).to(g.dtype)
        g *= grad / local_t.numel()
        return g, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp: TPContext,
                                 vocab_start: int = 0) -> torch.Tensor:
    """Mean cross-entropy of ``target`` under vocabulary-sharded ``logits``.

    With ``tp.size == 1`` this is ``torch.nn.functional.cross_entropy``.
    """
    if tp.size == 1:
        return nn.functional.cross_entropy(logits.float().flatten(0, -2), target.flatten())
    return _VocabParallelCrossEntropy.apply(logits, target, tp, vocab_start)
