"""The GPT decoder the trainer measures, built from three layer kinds.

Pre-LayerNorm blocks (Radford et al. 2019, GPT-2), causal attention through
``torch.nn.functional.scaled_dot_product_attention`` (``attention: flash``) or through the
explicit score matrix, soft-maxed in fp32 and kept for the backward pass as Megatron's
pre-FlashAttention path does (``attention: explicit``), an MLP of ``ffn_hidden`` (GELU, or
with ``mlp: swiglu`` the gated, bias-free SwiGLU MLP of Llama),
learned position embeddings and an output layer untied from the token embedding, so
that the parameter count is :meth:`autotune.config.model.ModelConfig.n_params` (plus the
vocabulary padding TP needs).

The model is a flat list of layers — :class:`Embedding`, ``n_layer`` x
:class:`Block`, :class:`Head` — so that :mod:`trainer.pipeline` can cut it into stages
and :class:`GPT` can run it whole. Tensor parallelism is a :class:`TPContext` handed to
each layer; with ``tp = 1`` no layer communicates. With sequence parallelism
(``TPContext.sequence_parallel``) the embedding's output is split along the sequence, the
layer norms and residual adds run on each rank's shard, and the output layer gathers it
again (:mod:`trainer.sequence_parallel`). Selective recompute (``checkpoint_attention``)
checkpoints the attention core, ``softmax(Q K^T / sqrt(d)) V``, as Megatron's
``--recompute-granularity selective`` does (``ParallelAttention._checkpointed_attention_
forward``, deepspeedai/Megatron-DeepSpeed@4efb479 ``megatron/model/transformer.py``):
its score matrix and probabilities are recomputed in the backward instead of stored.
With ``model.dropout > 0`` the embedding's output, each layer's two bias-dropout-adds and
(explicit path) the attention probabilities are dropped out as Megatron places them, the
masks seeded by layer and micro-batch so that every layout trains the same model
(:mod:`trainer.dropout`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.config.model import ModelConfig
from trainer.dropout import SITE_AFTER_ATTENTION, SITE_AFTER_MLP, SITE_EMBEDDING, DropoutRNG
from trainer.sequence_parallel import scatter_to_sequence, sum_grad_over_tp
from trainer.tensor_parallel import (
    INIT_STD,
    ColumnParallelLinear,
    RowParallelLinear,
    TPContext,
    VocabParallelEmbedding,
    init_normal,
    vocab_parallel_cross_entropy,
)
from trainer.ulysses import distributed_attention

__all__ = ["Embedding", "LayerNorm", "Block", "Head", "GPT", "LossFn", "padded_vocab",
           "build_layers"]


def padded_vocab(vocab_size: int, tp: int) -> int:
    """Vocabulary rounded up to a multiple of ``tp`` so that it splits evenly."""
    return -(-vocab_size // tp) * tp


def _generator(seed: int, layer_index: int) -> torch.Generator:
    # One stream per layer: a layer's weights do not depend on which stage builds it.
    return torch.Generator().manual_seed(seed * 1009 + layer_index)


class Embedding(nn.Module):
    """Token (vocabulary-parallel) plus learned position embeddings."""

    def __init__(self, model: ModelConfig, tp: TPContext, seed: int,
                 rng: DropoutRNG | None = None):
        super().__init__()
        self.rng = rng or DropoutRNG(0.0, seed)
        gen = _generator(seed, 0)
        v_pad = padded_vocab(model.vocab_size, tp.size)
        full = torch.zeros(v_pad, model.hidden)
        full[: model.vocab_size] = init_normal((model.vocab_size, model.hidden), gen)
        self.tokens = VocabParallelEmbedding(full, tp)
        self.positions = nn.Parameter(init_normal((model.seq_len, model.hidden), gen))
        self.tp = tp

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # A Ulysses rank holds positions [r s/u, (r+1) s/u) of the sequence.
        at = self.tp.ulysses.rank * tokens.shape[1] if self.tp.ulysses else 0
        x = self.tokens(tokens) + self.positions[at: at + tokens.shape[1]]
        s = x.shape[1]
        # Megatron-DeepSpeed's Embedding: all-reduced, then split (its backward gathers),
        # then the embedding dropout (hidden dropout's probability).
        if self.tp.sp:
            x = scatter_to_sequence(x, self.tp)
        if not (self.training and self.rng.active):
            return x
        return self.rng.hidden(x, 0, self.rng.next_key(0), SITE_EMBEDDING,
                               shard=sequence_shard(self.tp, s))


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that, on a sequence shard, sums its gradients over the TP group
    (each rank normalises only its positions; the weights stay replicated)."""

    def __init__(self, hidden: int, tp: TPContext):
        super().__init__(hidden)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tp.sp:
            return super().forward(x)
        return nn.functional.layer_norm(x, self.normalized_shape,
                                        sum_grad_over_tp(self.weight, self.tp),
                                        sum_grad_over_tp(self.bias, self.tp), self.eps)


class Block(nn.Module):
    """One pre-LN transformer layer: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, model: ModelConfig, tp: TPContext, seed: int, layer_index: int, *,
                 checkpoint_attention: bool = False, rng: DropoutRNG | None = None):
        super().__init__()
        gen = _generator(seed, layer_index)
        self.checkpoint_attention = checkpoint_attention
        self.rng = rng or DropoutRNG(0.0, seed)
        self.layer_index = layer_index
        self.tp = tp
        h, f, hd = model.hidden, model.ffn, model.head_dim
        kv = model.kv_heads * hd
        out_std = INIT_STD / math.sqrt(2 * model.n_layer)  # GPT-2's residual scaling
        self.heads, self.kv_heads, self.head_dim = model.n_head // tp.size, \
            model.kv_heads // tp.size, hd
        self.ln1 = LayerNorm(h, tp)
        self.qkv = ColumnParallelLinear(init_normal((h + 2 * kv, h), gen), tp,
                                        row_groups=(h, kv, kv))
        self.proj = RowParallelLinear(init_normal((h, h), gen, out_std), tp)
        self.ln2 = LayerNorm(h, tp)
        self.swiglu = model.mlp == "swiglu"
        self.explicit_attention = model.attention == "explicit"
        self.ulysses = (distributed_attention(self._checkpointed_core, tp.ulysses)
                        if tp.ulysses is not None else None)
        if self.swiglu:
            # Gate and up are column-parallel over f, fused in one GEMM: each group is
            # sharded separately (like Q, K, V), so a rank holds its gate and up columns.
            gate_up = torch.cat([init_normal((f, h), gen), init_normal((f, h), gen)])
            self.fc1 = ColumnParallelLinear(gate_up, tp, bias=False, row_groups=(f, f))
            self.fc2 = RowParallelLinear(init_normal((h, f), gen, out_std), tp, bias=False)
        else:
            self.fc1 = ColumnParallelLinear(init_normal((f, h), gen), tp)
            self.fc2 = RowParallelLinear(init_normal((h, f), gen, out_std), tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        drop = self.training and self.rng.active
        count = self.rng.next_key(self.layer_index) if drop else 0
        qkv = self.qkv(self.ln1(x))  # [b, s, .]: the whole sequence, also with SP
        b, s, _ = qkv.shape
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.ulysses is not None:  # [b, s/u, heads, d] behind the all-to-alls
            y = self.ulysses(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), count)
            out = self.proj(y.reshape(b, s, -1))
        else:
            out = self.proj(self._checkpointed_core(q, k, v, count).transpose(1, 2)
                            .reshape(b, s, -1))
        shard = sequence_shard(self.tp, s)
        if drop:  # Megatron's bias-dropout-add: dropout(out + bias) + residual
            out = self.rng.hidden(out, self.layer_index, count, SITE_AFTER_ATTENTION,
                                  shard=shard)
        x = x + out
        out = self.fc2(self._activation(self.fc1(self.ln2(x))))
        if drop:
            out = self.rng.hidden(out, self.layer_index, count, SITE_AFTER_MLP, shard=shard)
        return x + out

    def _checkpointed_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           count: int = 0) -> torch.Tensor:
        if self.checkpoint_attention:  # the count travels as an argument: same masks
            return checkpoint(self._core_attention, q, k, v, count, use_reentrant=False)
        return self._core_attention(q, k, v, count)

    def _core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        count: int = 0) -> torch.Tensor:
        """``softmax(Q K^T / sqrt(d)) V`` per head, its probabilities dropped out: what
        selective recompute recomputes. ``count``: the forward's micro-batch count."""
        if self.kv_heads != self.heads:  # grouped-query attention
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        drop = self.training and self.rng.active
        if self.explicit_attention:
            def dropout(probs: torch.Tensor) -> torch.Tensor:
                return self.rng.attention(probs, self.layer_index, count,
                                          self._first_head(q.shape[1]))
            return _explicit_attention(q, k, v, dropout if drop else None)
        if not drop:
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        stream = self.tp.rank + self.tp.size * (self.tp.ulysses.rank if self.tp.ulysses else 0)
        with self.rng.fused_stream(q.device, self.layer_index, count, stream):
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                              dropout_p=self.rng.p)

    def _first_head(self, local_heads: int) -> int:
        """The global index of the first head this rank attends over: its TP shard's, and
        within it, behind Ulysses' all-to-all, the ``rank``-th slice of ``local_heads``."""
        first = self.tp.rank * self.heads
        return first + (self.tp.ulysses.rank * local_heads if self.tp.ulysses else 0)

    def _activation(self, u: torch.Tensor) -> torch.Tensor:
        if self.swiglu:  # Shazeer 2020: silu(x W_gate) * (x W_up), on this rank's f/t columns
            gate, up = u.chunk(2, dim=-1)
            return nn.functional.silu(gate) * up
        return nn.functional.gelu(u)


def sequence_shard(tp: TPContext, s: int) -> tuple[int, int, int] | None:
    """``(start, stop, length)`` of the sequence positions this rank's ``[b, s, h]``
    activations hold, for dropout masks drawn over the whole sequence: Megatron's sequence
    parallelism splits the TP group's ``s`` positions; a Ulysses rank holds its ``s`` of
    ``s * u``; ``None`` when the rank holds the whole sequence."""
    if tp.sp:
        return (*tp.shard(s), s)
    if tp.ulysses is not None:
        return tp.ulysses.rank * s, (tp.ulysses.rank + 1) * s, s * tp.ulysses.size
    return None


def _explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        dropout: Callable[[torch.Tensor], torch.Tensor] | None = None
                        ) -> torch.Tensor:
    """Causal attention over a materialised ``s x s`` score matrix per head.

    What Megatron ran before FlashAttention (``FusedScaleMaskSoftmax``): the scores are a
    GEMM, masked and soft-maxed in fp32 (for 16-bit inputs; the max-subtraction keeps it
    stable), and autograd keeps the probabilities for the backward pass, which is the
    ``5 a s / h`` activation term of :func:`autotune.models.memory.layer_activation_bytes`.
    ``dropout``: applied to the probabilities (Megatron's attention dropout).
    """
    s = q.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if dropout is not None:
        probs = dropout(probs)
    return torch.matmul(probs, v)


class Head(nn.Module):
    """Final LayerNorm and the (vocabulary-parallel, untied) output layer.

    Returns this rank's shard of the logits; padded vocabulary entries get a large
    negative logit so that the softmax, and hence the loss, ignores them.
    """

    def __init__(self, model: ModelConfig, tp: TPContext, seed: int):
        super().__init__()
        gen = _generator(seed, model.n_layer + 1)
        v_pad = padded_vocab(model.vocab_size, tp.size)
        full = torch.zeros(v_pad, model.hidden)
        full[: model.vocab_size] = init_normal((model.vocab_size, model.hidden), gen)
        self.ln_f = LayerNorm(model.hidden, tp)
        self.out = ColumnParallelLinear(full, tp, bias=False)
        self.vocab_start, stop = tp.shard(v_pad)
        self.n_pad_local = max(0, stop - max(self.vocab_start, model.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.ln_f(x))
        if self.n_pad_local:
            mask = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
            mask[-self.n_pad_local:] = True
            logits = logits.masked_fill(mask, -1e30)
        return logits


class LossFn:
    """Mean token cross-entropy of the (sharded) logits; DeepSpeed's ``loss_fn(out, labels)``."""

    def __init__(self, model: ModelConfig, tp: TPContext):
        self.tp = tp
        self.vocab_start = tp.shard(padded_vocab(model.vocab_size, tp.size))[0]

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, labels, self.tp, self.vocab_start)


def build_layers(model: ModelConfig, tp: TPContext, seed: int, *,
                 checkpoint_attention: bool = False,
                 rng: DropoutRNG | None = None) -> list[nn.Module]:
    """The whole model as a flat list (for ``pp = 1``)."""
    return ([Embedding(model, tp, seed, rng)]
            + [Block(model, tp, seed, i + 1, checkpoint_attention=checkpoint_attention,
                     rng=rng) for i in range(model.n_layer)]
            + [Head(model, tp, seed)])


class GPT(nn.Module):
    """The layers run in sequence. ``recompute``: ``"full"`` checkpoints each block,
    ``"selective"`` each block's attention core, ``"none"`` nothing."""

    def __init__(self, model: ModelConfig, tp: TPContext, seed: int, *, recompute: str):
        super().__init__()
        self.rng = DropoutRNG(model.dropout, seed)
        self.layers = nn.ModuleList(build_layers(
            model, tp, seed, checkpoint_attention=recompute == "selective", rng=self.rng))
        self.recompute = recompute == "full"

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = tokens
        for layer in self.layers:
            if self.recompute and isinstance(layer, Block):
                x = self.rng.checkpoint(layer, x)
            else:
                x = layer(x)
        return x
