"""This rank's place in its tensor-parallel group: the value both the tensor-parallel layers
(:mod:`trainer.tensor_parallel`) and the sequence-parallel regions between them
(:mod:`trainer.sequence_parallel`) take, so that neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TPContext"]


@dataclass
class TPContext:
    """This rank's place in its tensor-parallel group.

    ``group`` may be bound after the layers are built: DeepSpeed's ``PipelineModule``
    creates the groups inside its constructor, after the layer specs are fixed.
    """

    rank: int = 0
    size: int = 1
    group: Any = None
    sequence_parallel: bool = False
    """Between the TP regions the activations are split along the sequence
    (:mod:`trainer.sequence_parallel`); only with ``size > 1``."""

    ulysses: Any = None
    """This rank's DeepSpeed-Ulysses group (:class:`trainer.ulysses.UlyssesContext`), or
    ``None``: the layers then hold ``s / u`` positions and attention runs behind
    all-to-alls."""

    @property
    def sp(self) -> bool:
        """Whether sequence parallelism is in effect (``size > 1``)."""
        return self.sequence_parallel and self.size > 1

    def shard(self, n: int) -> tuple[int, int]:
        """[start, stop) of this rank's share of ``n`` (``n`` divisible by ``size``)."""
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per
