"""The parallel layout of one training trial: a pure value object.

A :class:`Layout` says how a GPT training step is laid out over ``tp * pp * dp`` devices
and how the global batch is cut into micro-batches. It knows nothing about models or
clusters; :mod:`autotune.feasibility` decides whether a layout can run. The search, the
planner, every launcher and the trainer use this one object.

Rank order follows DeepSpeed's ``PipeModelDataParallelTopology(num_pp, num_mp, num_dp)``:
axes ``(pipe, data, model)`` with the model (TP) axis varying fastest, so that the ranks of
one TP group are consecutive and therefore land on the same node / card, where the
bandwidth is (Narayanan et al. 2021, section 3.3: tensor parallelism within a node).

>>> lay = Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=4)
>>> lay.world_size, lay.global_batch
(8, 8)
>>> lay.key()
'tp2-pp2-dp2-mb1-ga4-z0-none'
>>> Layout.from_dict(lay.to_dict()) == lay
True
>>> Layout.from_key(lay.key()) == lay
True

A search chooses five of the seven axes; :meth:`Layout.params` are those, and
:meth:`Layout.from_params` derives ``dp`` and ``grad_accum`` back from the study's world
size and global batch:

>>> lay.params()  # doctest: +NORMALIZE_WHITESPACE
{'tp': 2, 'pp': 2, 'micro_batch': 1, 'zero_stage': 0, 'recompute': 'none',
 'sequence_parallel': False}
>>> Layout.from_params(lay.params(), world_size=8, global_batch=8) == lay
True

Sequence parallelism (Korthikanti et al. 2022, section 4.2.2) shards the layer-norm and
dropout regions over the TP group, so it needs ``tp > 1``; its key gains ``-sp``:

>>> sp = Layout(tp=2, pp=1, dp=2, micro_batch=2, grad_accum=4, zero_stage=1,
...             recompute="selective", sequence_parallel=True)
>>> sp.key()
'tp2-pp1-dp2-mb2-ga4-z1-selective-sp'
>>> Layout.from_key(sp.key()) == sp
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

from autotune.errors import SpecError

__all__ = ["Layout", "Recompute", "RECOMPUTE_CHOICES", "ZERO_STAGES", "needs_no_less_memory"]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_CHOICES: tuple[str, ...] = ("none", "selective", "full")
"""``selective`` recomputes only the attention core (Korthikanti et al. 2022, section 5),
``full`` every transformer layer (Chen et al. 2016)."""
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


@dataclass(frozen=True, order=True)
class Layout:
    """One point of the layout space."""

    tp: int
    """Tensor-parallel degree (Megatron-style intra-layer split)."""
    pp: int
    """Pipeline-parallel degree (number of stages)."""
    dp: int
    """Data-parallel degree (replicas, ZeRO shards over these)."""
    micro_batch: int
    """Sequences per micro-batch per data-parallel replica."""
    grad_accum: int
    """Micro-batches per optimizer step (with PP: micro-batches in the pipeline)."""
    zero_stage: int = 0
    """ZeRO stage 0-3 (Rajbhandari et al. 2020)."""
    recompute: Recompute = "none"
    """Activation recomputation: ``"none"``, ``"selective"`` (the attention core:
    softmax(Q K^T) V; Korthikanti et al. 2022, section 5) or ``"full"`` (every transformer
    layer)."""
    sequence_parallel: bool = False
    """Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): the layer-norm and
    dropout regions are split along the sequence over the TP group, all-gather and
    reduce-scatter replacing TP's all-reduces. Only with ``tp > 1``."""

    SEARCH_AXES: ClassVar[tuple[str, ...]] = ("tp", "pp", "micro_batch", "zero_stage",
                                              "recompute", "sequence_parallel")
    """The axes a search chooses (the Optuna parameters of a trial). ``dp`` and
    ``grad_accum`` are not among them: the world size and the global batch fix them."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batch", "grad_accum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"layout.{name}", value, "allowed: an integer >= 1")
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise SpecError("layout.zero_stage", self.zero_stage, "allowed: 0, 1, 2 or 3")
        if self.recompute not in RECOMPUTE_CHOICES:
            raise SpecError("layout.recompute", self.recompute,
                            "allowed: 'none', 'selective' or 'full'")
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError("layout.sequence_parallel", self.sequence_parallel,
                            "allowed: true or false")
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("layout.sequence_parallel", True,
                            "allowed: true only with tp > 1 (it shards over the TP group; "
                            f"this layout has tp={self.tp})")

    @property
    def world_size(self) -> int:
        """Devices (ranks) the layout occupies."""
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: ``dp * micro_batch * grad_accum``."""
        return self.dp * self.micro_batch * self.grad_accum

    @property
    def model_parallel_size(self) -> int:
        """Devices holding one model replica (``tp * pp``), torchtitan's non-DP size."""
        return self.tp * self.pp

    def key(self) -> str:
        """A canonical, human-readable identifier (used to find repeats in a study)."""
        return (
            f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}"
            f"-ga{self.grad_accum}-z{self.zero_stage}-{self.recompute}"
            + ("-sp" if self.sequence_parallel else "")
        )

    @classmethod
    def from_key(cls, key: str) -> Layout:
        """Inverse of :meth:`key` (the layout claims of a study store keys only)."""
        try:
            parts = key.split("-")
            sp = len(parts) == 8 and parts[7] == "sp"
            tp, pp, dp, mb, ga, z, rc = parts[:7] if sp else parts
            return cls(tp=int(tp[2:]), pp=int(pp[2:]), dp=int(dp[2:]),
                       micro_batch=int(mb[2:]), grad_accum=int(ga[2:]),
                       zero_stage=int(z[1:]), recompute=rc,  # type: ignore[arg-type]
                       sequence_parallel=sp)
        except ValueError:
            raise SpecError("layout key", key, "expected the form "
                            "tpT-ppP-dpD-mbM-gaG-zZ-none|selective|full[-sp]") from None

    def params(self) -> dict[str, Any]:
        """The values of :attr:`SEARCH_AXES`: what a study enqueues and the dashboard shows.

        >>> Layout(tp=4, pp=1, dp=2, micro_batch=2, grad_accum=1, recompute="full",
        ...        sequence_parallel=True).params()  # doctest: +NORMALIZE_WHITESPACE
        {'tp': 4, 'pp': 1, 'micro_batch': 2, 'zero_stage': 0, 'recompute': 'full',
         'sequence_parallel': True}
        """
        return {axis: getattr(self, axis) for axis in self.SEARCH_AXES}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, world_size: int,
                    global_batch: int) -> Layout:
        """Inverse of :meth:`params` for a study of ``world_size`` devices and
        ``global_batch`` sequences per step: ``dp = world_size / (tp * pp)`` and
        ``grad_accum = global_batch / (dp * micro_batch)``, each at least 1. Parameters
        stored before sequence parallelism existed have no ``sequence_parallel``: false.

        >>> Layout.from_params({"tp": 2, "pp": 1, "micro_batch": 4, "zero_stage": 1,
        ...                     "recompute": "none"}, world_size=8, global_batch=32).key()
        'tp2-pp1-dp4-mb4-ga2-z1-none'
        """
        tp, pp, mb = int(params["tp"]), int(params["pp"]), int(params["micro_batch"])
        dp = max(world_size // (tp * pp), 1)
        return cls(tp=tp, pp=pp, dp=dp, micro_batch=mb,
                   grad_accum=max(global_batch // (dp * mb), 1),
                   zero_stage=int(params["zero_stage"]),
                   recompute=(params["recompute"] if params["recompute"] in RECOMPUTE_CHOICES
                              else "none"),
                   sequence_parallel=bool(params.get("sequence_parallel", False)))

    def to_dict(self) -> dict[str, Any]:
        """The ``layout`` object of a trial spec (``docs/trainer.md``, "The spec")."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> Layout:
        """Build from a trial spec's ``layout`` mapping; errors name the field."""
        if not isinstance(data, dict):
            raise SpecError("layout", data, "expected a mapping", source=source)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(
                f"layout.{unknown[0]}", data[unknown[0]],
                f"unknown key; allowed keys: {', '.join(sorted(known))}", source=source,
            )
        required = ("tp", "pp", "dp", "micro_batch", "grad_accum")
        for name in required:
            if name not in data:
                raise SpecError(f"layout.{name}", None, "required field is missing", source=source)
        try:
            return cls(**data)
        except SpecError as err:
            raise SpecError(err.field, err.value, err.allowed, source=source) from None

    def __str__(self) -> str:
        return self.key()


# Memory order of activation recomputation: "none" keeps every activation (more memory).
# Selective recompute keeps everything but the attention core (Korthikanti et al. 2022).
_RECOMPUTE_MEMORY = {"full": 0, "selective": 1, "none": 2}
"""Recomputation choices, least activation memory first."""


def needs_no_less_memory(layout: Layout, than: Layout) -> bool:
    """Whether ``layout`` needs at least the memory of ``than`` per device.

    Same tp and pp (so the same model shard and dp), a micro-batch at least as large,
    recomputation no stronger and a ZeRO stage no higher (each ZeRO stage only removes
    state: Rajbhandari et al. 2020, fig. 1). Gradient accumulation does not change the
    peak: the micro-batches in flight are bounded by pp under 1F1B.
    """
    return (layout.tp == than.tp and layout.pp == than.pp
            and layout.micro_batch >= than.micro_batch
            and _RECOMPUTE_MEMORY[layout.recompute] >= _RECOMPUTE_MEMORY[than.recompute]
            and layout.sequence_parallel <= than.sequence_parallel  # SP only removes memory
            and layout.zero_stage <= than.zero_stage)
