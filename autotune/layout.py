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

A search chooses the axes but two; :meth:`Layout.params` are those, and
:meth:`Layout.from_params` derives ``dp`` and ``grad_accum`` back from the study's world
size and global batch:

>>> lay.params()  # doctest: +NORMALIZE_WHITESPACE
{'tp': 2, 'pp': 2, 'micro_batch': 1, 'zero_stage': 0, 'recompute': 'none',
 'sequence_parallel': False, 'zero_variant': 'none', 'zero_shard': 1, 'ulysses': 1}
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

ZeRO-3 has two variants that shard over a group smaller than the data-parallel one:
MiCS (Zhang et al. 2022) keeps every state sharded over ``zero_shard`` ranks and replicates
that shard group; hpZ (ZeRO++, Wang et al. 2023, section 3.2) keeps a secondary copy of
the parameters sharded over ``zero_shard`` ranks (a node) for the backward all-gather.
DeepSpeed-Ulysses (Jacobs et al. 2023) splits the sequence over ``ulysses`` ranks, which
multiply into the world size as in Megatron-DeepSpeed
(``dp = world / (tp * pp * ulysses)``). Each adds its own key suffix:

>>> mics = Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=2, zero_stage=3,
...               zero_variant="mics", zero_shard=4, ulysses=2)
>>> mics.key(), mics.world_size, mics.global_batch
('tp1-pp1-dp8-mb1-ga2-z3-none-mics4-uly2', 16, 16)
>>> Layout.from_key(mics.key()) == mics
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

from autotune.errors import SpecError

__all__ = ["Layout", "Recompute", "RECOMPUTE_CHOICES", "ZERO_STAGES", "ZERO_VARIANTS",
           "ZeroVariant", "needs_no_less_memory"]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_CHOICES: tuple[str, ...] = ("none", "selective", "full")
"""``selective`` recomputes only the attention core (Korthikanti et al. 2022, section 5),
``full`` every transformer layer (Chen et al. 2016)."""
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
ZeroVariant = Literal["none", "mics", "hpz"]
ZERO_VARIANTS: tuple[str, ...] = ("none", "mics", "hpz")
"""ZeRO-3 variants: ``mics`` (DeepSpeed ``zero_optimization.mics_shard_size``; Zhang et al.
2022) and ``hpz`` (``zero_optimization.zero_hpz_partition_size``; Wang et al. 2023)."""


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

    zero_variant: ZeroVariant = "none"
    """ZeRO-3 variant: ``"none"``, ``"mics"`` (every state sharded over ``zero_shard``
    ranks, the shard group replicated; Zhang et al. 2022) or ``"hpz"`` (ZeRO++'s secondary
    parameter copy sharded over ``zero_shard`` ranks; Wang et al. 2023). Only with
    ``zero_stage == 3``."""
    zero_shard: int = 1
    """MiCS shard size or hpZ partition size (ranks); 1 without a variant, else >= 2 and a
    divisor of :attr:`zero_group` (a feasibility rule)."""
    ulysses: int = 1
    """DeepSpeed-Ulysses sequence-parallel degree (Jacobs et al. 2023; Megatron-DeepSpeed's
    ``--ds-sequence-parallel-size``): ranks that split each sequence, all-to-all around
    attention. Multiplies into the world size; exclusive with ``sequence_parallel``."""

    SEARCH_AXES: ClassVar[tuple[str, ...]] = ("tp", "pp", "micro_batch", "zero_stage",
                                              "recompute", "sequence_parallel",
                                              "zero_variant", "zero_shard", "ulysses")
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
        self._check_zero3_and_ulysses()

    def _check_zero3_and_ulysses(self) -> None:
        for name in ("zero_shard", "ulysses"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"layout.{name}", value, "allowed: an integer >= 1")
        if self.zero_variant not in ZERO_VARIANTS:
            raise SpecError("layout.zero_variant", self.zero_variant,
                            "allowed: 'none', 'mics' or 'hpz'")
        if self.zero_variant != "none" and self.zero_stage != 3:
            raise SpecError("layout.zero_variant", self.zero_variant,
                            "allowed: 'mics' or 'hpz' only with zero_stage 3 (this layout "
                            f"has zero_stage={self.zero_stage})")
        if self.zero_variant == "none" and self.zero_shard != 1:
            raise SpecError("layout.zero_shard", self.zero_shard,
                            "allowed: 1 without a zero_variant (mics or hpz)")
        if self.zero_variant != "none" and self.zero_shard < 2:
            raise SpecError("layout.zero_shard", self.zero_shard,
                            f"allowed: an integer >= 2 with zero_variant {self.zero_variant!r}")
        if self.ulysses > 1 and self.sequence_parallel:
            raise SpecError("layout.ulysses", self.ulysses,
                            "allowed: 1 with sequence_parallel (Megatron-DeepSpeed refuses "
                            "DeepSpeed-Ulysses together with Megatron's sequence parallelism)")

    @property
    def world_size(self) -> int:
        """Devices (ranks) the layout occupies: ``tp * pp * dp * ulysses``, as in
        Megatron-DeepSpeed's ``initialize_model_parallel``."""
        return self.tp * self.pp * self.dp * self.ulysses

    @property
    def zero_group(self) -> int:
        """Ranks ZeRO partitions over: ``dp * ulysses`` (with Ulysses DeepSpeed shards over
        its sequence-data-parallel group, ``engine.seq_data_parallel_group``)."""
        return self.dp * self.ulysses

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: ``dp * micro_batch * grad_accum``."""
        return self.dp * self.micro_batch * self.grad_accum

    @property
    def model_parallel_size(self) -> int:
        """Devices holding one model replica (``tp * pp``), torchtitan's non-DP size."""
        return self.tp * self.pp

    def key(self) -> str:
        """A canonical, human-readable identifier (used to find repeats in a study):
        ``-sp``, ``-mics<N>``/``-hpz<N>`` and ``-uly<N>`` are appended when set."""
        return (
            f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}"
            f"-ga{self.grad_accum}-z{self.zero_stage}-{self.recompute}"
            + ("-sp" if self.sequence_parallel else "")
            + (f"-{self.zero_variant}{self.zero_shard}" if self.zero_variant != "none" else "")
            + (f"-uly{self.ulysses}" if self.ulysses > 1 else "")
        )

    @classmethod
    def from_key(cls, key: str) -> Layout:
        """Inverse of :meth:`key` (the layout claims of a study store keys only)."""
        try:
            parts = key.split("-")
            tp, pp, dp, mb, ga, z, rc = parts[:7]
            rest = parts[7:]
            sp = bool(rest) and rest[0] == "sp"
            rest = rest[1:] if sp else rest
            variant, shard, ulysses = "none", 1, 1
            if rest and rest[0].startswith(("mics", "hpz")):
                variant = "mics" if rest[0].startswith("mics") else "hpz"
                shard, rest = int(rest[0][len(variant):]), rest[1:]
            if rest and rest[0].startswith("uly"):
                ulysses, rest = int(rest[0][3:]), rest[1:]
            if rest:
                raise ValueError(key)
            return cls(tp=int(tp[2:]), pp=int(pp[2:]), dp=int(dp[2:]),
                       micro_batch=int(mb[2:]), grad_accum=int(ga[2:]),
                       zero_stage=int(z[1:]), recompute=rc,  # type: ignore[arg-type]
                       sequence_parallel=sp,
                       zero_variant=variant,  # type: ignore[arg-type]
                       zero_shard=shard, ulysses=ulysses)
        except ValueError:
            raise SpecError("layout key", key, "expected the form tpT-ppP-dpD-mbM-gaG-zZ-"
                            "none|selective|full[-sp][-micsN|-hpzN][-ulyN]") from None

    def params(self) -> dict[str, Any]:
        """The values of :attr:`SEARCH_AXES`: what a study enqueues and the dashboard shows.

        >>> Layout(tp=4, pp=1, dp=2, micro_batch=2, grad_accum=1, recompute="full",
        ...        sequence_parallel=True).params()  # doctest: +NORMALIZE_WHITESPACE
        {'tp': 4, 'pp': 1, 'micro_batch': 2, 'zero_stage': 0, 'recompute': 'full',
         'sequence_parallel': True, 'zero_variant': 'none', 'zero_shard': 1, 'ulysses': 1}
        """
        return {axis: getattr(self, axis) for axis in self.SEARCH_AXES}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, world_size: int,
                    global_batch: int) -> Layout:
        """Inverse of :meth:`params` for a study of ``world_size`` devices and
        ``global_batch`` sequences per step: ``dp = world_size / (tp * pp)`` and
        ``grad_accum = global_batch / (dp * micro_batch)``, each at least 1. Parameters
        stored before sequence parallelism existed have no ``sequence_parallel``: false;
        before the ZeRO-3 variants and Ulysses: ``none``, 1 and 1.

        >>> Layout.from_params({"tp": 2, "pp": 1, "micro_batch": 4, "zero_stage": 1,
        ...                     "recompute": "none"}, world_size=8, global_batch=32).key()
        'tp2-pp1-dp4-mb4-ga2-z1-none'
        """
        tp, pp, mb = int(params["tp"]), int(params["pp"]), int(params["micro_batch"])
        ulysses = int(params.get("ulysses", 1))
        dp = max(world_size // (tp * pp * ulysses), 1)
        return cls(tp=tp, pp=pp, dp=dp, micro_batch=mb,
                   grad_accum=max(global_batch // (dp * mb), 1),
                   zero_stage=int(params["zero_stage"]),
                   recompute=(params["recompute"] if params["recompute"] in RECOMPUTE_CHOICES
                              else "none"),
                   sequence_parallel=bool(params.get("sequence_parallel", False)),
                   zero_variant=params.get("zero_variant", "none"),
                   zero_shard=int(params.get("zero_shard", 1)), ulysses=ulysses)

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
        required = ("tp", "pp", "dp", "micro_batch", "grad_accum")  # the rest have defaults
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

    Same tp, pp and Ulysses degree (so the same model shard and dp), a micro-batch at
    least as large, recomputation no stronger and a ZeRO stage no higher (each ZeRO stage
    only removes state: Rajbhandari et al. 2020, fig. 1), the same ZeRO-3 variant and shard
    (MiCS shards over fewer ranks than plain ZeRO-3, so it is no "higher" stage). Gradient
    accumulation does not change the peak: the micro-batches in flight are bounded by pp
    under 1F1B.
    """
    return (layout.tp == than.tp and layout.pp == than.pp and layout.ulysses == than.ulysses
            and (layout.zero_variant, layout.zero_shard) == (than.zero_variant, than.zero_shard)
            and layout.micro_batch >= than.micro_batch
            and _RECOMPUTE_MEMORY[layout.recompute] >= _RECOMPUTE_MEMORY[than.recompute]
            and layout.sequence_parallel <= than.sequence_parallel  # SP only removes memory
            and layout.zero_stage <= than.zero_stage)
