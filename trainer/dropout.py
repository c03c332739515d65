"""Seeded dropout where Megatron places it, with masks that do not depend on the layout.

Megatron-DeepSpeed applies ``--hidden-dropout`` to the embedding's output and in each
layer's two bias-dropout-adds (after the attention projection and after the MLP), and
``--attention-dropout`` to the soft-maxed scores (``megatron/model/language_model.py``
``Embedding.forward``, ``megatron/model/transformer.py`` ``CoreAttention.forward`` and
``ParallelTransformerLayer.forward``, deepspeedai/Megatron-DeepSpeed@4efb479). Its RNG
(``megatron/core/tensor_parallel/random.py`` ``model_parallel_cuda_manual_seed``): the
hidden dropout draws from the default generator, seeded alike on every rank of a TP group,
so its mask is the same on all of them (the tensor is replicated); the attention dropout
draws inside ``get_cuda_rng_tracker().fork()``, seeded ``seed + 2718 + tp_rank``, a
different stream per rank (each rank holds other heads); under sequence parallelism the
whole layer runs in the forked stream (each rank holds other positions).

Here every mask is a pure function of a key: (seed, layer, micro-batch count, site, and for
the attention scores the *global* head). So the hidden masks are the same on every TP rank,
as Megatron's; each rank's attention masks are its own heads' (different across ranks, as
Megatron's), and equal to the slice of a ``tp = 1`` run's; a sequence shard takes its
positions of the whole-sequence mask. A TP or PP layout therefore trains exactly as the
single-device run does, which is what the trainer's equivalence tests check. The micro-batch
count is per layer and advances once per forward; a recomputed forward (full or selective
recompute: :meth:`DropoutRNG.checkpoint`) draws the keys of the forward it repeats.

The fused attention path (``torch.nn.functional.scaled_dot_product_attention``) draws its
dropout inside the kernel from the device's default generator: it runs under that
generator forked and seeded from the key and the TP rank, Megatron's per-rank stream, so
it is reproducible and recomputes exactly, but a TP layout's attention masks are not a
``tp = 1`` run's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

__all__ = ["DropoutRNG", "SITE_ATTENTION", "SITE_EMBEDDING", "SITE_AFTER_ATTENTION",
           "SITE_AFTER_MLP"]

SITE_EMBEDDING = 0
SITE_AFTER_ATTENTION = 1
SITE_AFTER_MLP = 2
SITE_ATTENTION = 3

_MASK64 = (1 << 64) - 1


def _mix(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 over each; Steele et al. 2014), stable
    across processes, unlike ``hash``."""
    z = 0x9E3779B97F4A7C15
    for part in parts:
        z = (z ^ (part & _MASK64)) & _MASK64
        z = (z + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z >> 1


class DropoutRNG:
    """The dropout of one rank's model: its probability, seed and per-layer counters.

    ``p == 0`` makes every method a no-op (no random numbers drawn, nothing stored).
    """

    def __init__(self, p: float, seed: int) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout: got {p!r}; allowed: a probability >= 0 and < 1")
        self.p = p
        self.seed = seed
        self._counts: dict[int, int] = {}
        self._generators: dict[torch.device, torch.Generator] = {}

    @property
    def active(self) -> bool:
        return self.p > 0.0

    def next_key(self, layer: int) -> int:
        """The micro-batch count of ``layer``'s next forward (then advanced)."""
        count = self._counts.get(layer, 0)
        self._counts[layer] = count + 1
        return count

    def _generator(self, device: torch.device, seed: int) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device)
        return gen.manual_seed(seed)

    def _keep(self, shape: tuple[int, ...], device: torch.device, *key: int) -> torch.Tensor:
        gen = self._generator(device, _mix(self.seed, *key))
        return torch.rand(shape, generator=gen, device=device) >= self.p

    def hidden(self, x: torch.Tensor, layer: int, count: int, site: int, *,
               shard: tuple[int, int, int] | None = None) -> torch.Tensor:
        """Dropout of a ``[b, s, h]`` activation; ``shard``: ``(start, stop, s)`` when
        ``x`` holds positions ``start:stop`` of a sequence of ``s`` (sequence parallel)."""
        if not self.active:
            return x
        b, n, h = x.shape
        full = shard[2] if shard else n
        keep = self._keep((b, full, h), x.device, layer, count, site)
        if shard:
            keep = keep[:, shard[0]:shard[1]]
        return self._apply(x, keep)

    def attention(self, probs: torch.Tensor, layer: int, count: int,
                  first_head: int) -> torch.Tensor:
        """Dropout of soft-maxed scores ``[b, heads, s, s]`` whose heads are the global
        heads ``first_head, first_head + 1, ...``: one mask per global head."""
        if not self.active:
            return probs
        b, heads, s, k = probs.shape
        keep = torch.stack([self._keep((b, s, k), probs.device, layer, count, SITE_ATTENTION,
                                       first_head + i) for i in range(heads)], dim=1)
        return self._apply(probs, keep)

    def _apply(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        # ``where`` keeps only the boolean mask for the backward (1 byte an element, as
        # torch's and Megatron's dropout do: the memory model's mask term).
        return torch.where(keep, x, x.new_zeros(())) * (1.0 / (1.0 - self.p))

    @contextmanager
    def fused_stream(self, device: torch.device, layer: int, count: int,
                     tp_rank: int) -> Iterator[None]:
        """The device's default generator forked and seeded for a fused kernel's own
        dropout (Megatron's per-TP-rank stream); restored afterwards."""
        on_host = device.type == "cpu"
        with torch.random.fork_rng(devices=[] if on_host else [device],
                                   device_type="cuda" if on_host else device.type):
            torch.manual_seed(_mix(self.seed, layer, count, SITE_ATTENTION, 2718 + tp_rank))
            yield

    def checkpoint(self, function: Callable[..., Any], *args: Any) -> Any:
        """``torch.utils.checkpoint`` (non-reentrant) of ``function``, whose recomputation
        draws the same keys as its forward did: the counters are set back to where they
        stood for the recompute, and forward again after it (the pipeline has run other
        micro-batches' forwards by then)."""
        before = dict(self._counts)
        calls = [0]

        def run(*inner: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                return function(*inner)
            now = dict(self._counts)
            self._counts = dict(before)
            try:
                return function(*inner)
            finally:  # also when the recompute stops early (PyTorch raises to stop it)
                self._counts = now

        return torch_checkpoint(run, *args, use_reentrant=False)
