"""Sequence parallelism: the TP group's collectives along the sequence axis.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), section 4.2.2 and fig. 5: outside the tensor-parallel attention and MLP
the activations (layer norms, residual adds, dropout) are split along the sequence over the
``t`` ranks of the TP group instead of being replicated. TP's ``f``/``g`` all-reduces become

* ``g`` -> all-gather in forward (before a column-parallel linear), reduce-scatter in
  backward (:func:`gathered_linear`), and
* ``g-bar`` -> reduce-scatter in forward (after a row-parallel linear), all-gather in
  backward (:func:`reduce_scatter_to_sequence`),

which move the same bytes as the all-reduce they replace (a ring all-reduce *is* a
reduce-scatter and an all-gather). Like Megatron's ``LinearWithGradAccumulationAndAsync-
Communication`` (deepspeedai/Megatron-DeepSpeed@4efb479 ``megatron/core/tensor_parallel/
layers.py``), the column-parallel linear saves only its sequence shard for the backward and
gathers it again there, so its input is stored ``1/t`` too (the paper's ``34/t``).

The trainer's activations are ``[batch, sequence, hidden]`` (Megatron's are ``[s, b, h]``):
the split axis is 1. Parameters used on a sequence shard (the layer norms, the biases added
after a reduce-scatter) see only their shard's gradient; :func:`sum_grad_over_tp` sums it
over the group in the backward. (Megatron sums such grads after the backward,
``allreduce_layernorm_grads`` in ``megatron/optimizer/optimizer.py``, and only without
``--deepspeed``: see docs/models.md, "Sequence parallelism and selective recompute".)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from trainer.tp_context import TPContext

__all__ = ["scatter_to_sequence", "reduce_scatter_to_sequence", "gather_from_sequence",
           "gathered_linear", "sum_grad_over_tp"]

SEQ_DIM = 1
"""The sequence axis of the trainer's ``[b, s, h]`` activations."""


def _all_gather(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """``[b, s/t, h]`` shards -> ``[b, s, h]`` on every rank (rank order along s)."""
    xs = x.transpose(0, SEQ_DIM).contiguous()  # collectives concatenate along dim 0
    out = torch.empty((xs.shape[0] * tp.size, *xs.shape[1:]), dtype=xs.dtype,
                      device=xs.device)
    dist.all_gather_into_tensor(out, xs, group=tp.group)
    return out.transpose(0, SEQ_DIM)


def _reduce_scatter(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """``[b, s, h]`` partial sums -> this rank's ``[b, s/t, h]`` shard of their sum."""
    xs = x.transpose(0, SEQ_DIM).contiguous()
    out = torch.empty((xs.shape[0] // tp.size, *xs.shape[1:]), dtype=xs.dtype,
                      device=xs.device)
    dist.reduce_scatter_tensor(out, xs, group=tp.group)
    return out.transpose(0, SEQ_DIM)


def _split(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return x.chunk(tp.size, dim=SEQ_DIM)[tp.rank].contiguous()


class _ScatterToSequence(torch.autograd.Function):
    """Forward: keep this rank's sequence shard; backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:
        ctx.tp = tp
        return _split(x, tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, ctx.tp), None


class _GatherFromSequence(torch.autograd.Function):
    """Forward: all-gather the shards; backward: reduce-scatter the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:
        ctx.tp = tp
        return _all_gather(x, tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _reduce_scatter(grad, ctx.tp), None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Forward: reduce-scatter the partial sums; backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:
        ctx.tp = tp
        return _reduce_scatter(x, tp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, ctx.tp), None


class _SumGradOverTP(torch.autograd.Function):
    """Forward: identity; backward: all-reduce (sum) over the TP group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class _GatheredLinear(torch.autograd.Function):
    """``all_gather(x) W^T + b`` that stores only the shard ``x`` for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                tp: TPContext) -> torch.Tensor:
        ctx.tp = tp
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.linear(_all_gather(x, tp), weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.Tensor | None, None]:
        x, weight = ctx.saved_tensors
        full = _all_gather(x, ctx.tp)  # gathered again rather than stored (Megatron's way)
        grad_x = _reduce_scatter(grad.matmul(weight), ctx.tp)
        grad_w = grad.flatten(0, -2).t().matmul(full.flatten(0, -2))
        grad_b = grad.flatten(0, -2).sum(dim=0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


def scatter_to_sequence(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """Enter the sequence-parallel region from replicated ``x`` (after the embedding)."""
    return _ScatterToSequence.apply(x, tp)


def gather_from_sequence(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """Leave the sequence-parallel region: the whole sequence on every rank."""
    return _GatherFromSequence.apply(x, tp)


def reduce_scatter_to_sequence(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """A row-parallel linear's partial sums, summed and split along the sequence."""
    return _ReduceScatterToSequence.apply(x, tp)


def gathered_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    tp: TPContext) -> torch.Tensor:
    """A column-parallel linear on sequence-sharded input (see the module docstring)."""
    return _GatheredLinear.apply(x, weight, bias, tp)


def sum_grad_over_tp(param: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """``param`` as used on a sequence shard: its gradient summed over the TP group."""
    return _SumGradOverTP.apply(param, tp)
