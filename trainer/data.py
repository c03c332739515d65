"""Training tokens: deterministic synthetic sequences, or a memory-mapped token file.

Both sources define the *global* batch of optimizer step ``k`` first (``global_batch``
sequences of ``seq_len + 1`` tokens) and then hand each data-parallel rank its
micro-batches, so that every layout trains on exactly the same sequences and its losses
are comparable with any other layout's.

Sequence ``j`` of the global batch goes to micro-batch ``m = j // (dp * mb)`` of
data-parallel rank ``d = (j // mb) % dp``.

>>> src = SyntheticTokens(vocab_size=50, seq_len=4, seed=1)
>>> a = micro_batches(src, step=0, dp=1, dp_rank=0, micro_batch=2, grad_accum=2)
>>> b = micro_batches(src, step=0, dp=2, dp_rank=1, micro_batch=1, grad_accum=2)
>>> bool((a[0][0][1] == b[0][0][0]).all()), a[0][0].shape, a[0][1].shape
(True, torch.Size([2, 4]), torch.Size([2, 4]))
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

__all__ = ["TokenSource", "SyntheticTokens", "MemmapTokens", "micro_batches"]


class TokenSource(Protocol):
    def global_batch(self, step: int, n_sequences: int) -> torch.Tensor:
        """``(n_sequences, seq_len + 1)`` int64 tokens of optimizer step ``step``."""
        ...


class SyntheticTokens:
    """Uniform random tokens from a generator seeded by ``(seed, step)``."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def global_batch(self, step: int, n_sequences: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + step)
        return torch.randint(0, self.vocab_size, (n_sequences, self.seq_len + 1), generator=gen)


class MemmapTokens:
    """A flat token stream (Megatron ``.bin`` style, no index) read through ``np.memmap``.

    Sequence ``i`` (counted over the whole run) is the window starting at token
    ``(i * seq_len) mod (n_tokens - seq_len - 1)``: consecutive, overlapping by the one
    label token, and wrapping around a file shorter than the run.
    """

    def __init__(self, path: str, seq_len: int, dtype: str = "uint16"):
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        self.seq_len = seq_len
        if len(self.tokens) < seq_len + 2:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, need at least {seq_len + 2}")

    def global_batch(self, step: int, n_sequences: int) -> torch.Tensor:
        span = len(self.tokens) - self.seq_len - 1
        rows = []
        for j in range(n_sequences):
            start = ((step * n_sequences + j) * self.seq_len) % span
            rows.append(np.asarray(self.tokens[start: start + self.seq_len + 1], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))


def micro_batches(source: TokenSource, *, step: int, dp: int, dp_rank: int, micro_batch: int,
                  grad_accum: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This data-parallel rank's ``(inputs, labels)`` micro-batches of step ``step``."""
    batch = source.global_batch(step, dp * micro_batch * grad_accum)
    out = []
    for m in range(grad_accum):
        lo = (m * dp + dp_rank) * micro_batch
        seqs = batch[lo: lo + micro_batch]
        out.append((seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()))
    return out
