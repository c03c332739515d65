"""The one feasibility check: can this layout run this model here, and if not, why?

The tuner (before proposing a trial), the planner (to rank the space), every launcher
(before spending device time) and the trainer (before building the model) call
:func:`check_layout`. It returns readable :class:`Reason` objects rather than raising, so
that callers can show *all* reasons at once (torchtitan's ``ParallelDims`` prints every
factor); an empty list means feasible.

>>> from autotune.config.model import MODEL_PRESETS
>>> from autotune.layout import Layout
>>> tiny = MODEL_PRESETS["tiny"]
>>> check_layout(Layout(tp=2, pp=2, dp=1, micro_batch=2, grad_accum=4), tiny, world_size=4)
[]
>>> [r.code for r in check_layout(Layout(tp=3, pp=2, dp=1, micro_batch=1, grad_accum=1,
...     zero_stage=2), tiny, world_size=4)]
['world_size', 'tp_heads', 'tp_hidden', 'tp_ffn', 'zero_pp']
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.layout import Layout

__all__ = ["Reason", "Placement", "MemoryBudget", "Constraints", "check_layout", "REASON_CODES"]

REASON_CODES: dict[str, str] = {
    "world_size": "tp*pp*dp differs from the world size",
    "global_batch": "dp*micro_batch*grad_accum differs from the global batch",
    "tp_heads": "tp does not divide the attention heads",
    "tp_kv_heads": "tp does not divide the key/value heads",
    "tp_hidden": "tp does not divide the hidden size",
    "tp_ffn": "tp does not divide the MLP size",
    "pp_layers": "more pipeline stages than layers",
    "zero_pp": "ZeRO-2/3 with pipeline parallelism (DeepSpeed refuses it)",
    "tp_cross_node": "tensor-parallel group spans nodes",
    "tp_cross_card": "tensor-parallel group spans cards",
    "memory": "predicted memory exceeds the device",
    "oom_dominated": "a less memory-hungry sibling ran out of memory",
}


@dataclass(frozen=True)
class Reason:
    """Why a layout is infeasible: a stable ``code`` (a key of :data:`REASON_CODES`)
    for grouping and counting, and a message with the numbers."""

    code: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Placement:
    """Where ranks land: TP groups are consecutive ranks (see :mod:`autotune.layout`)."""

    devices_per_node: int
    devices_per_card: int = 1
    allow_tp_across_nodes: bool = False
    """LRZ and Narayanan et al. (2021, fig. 13) both found TP across nodes slow."""
    allow_tp_across_cards: bool = True


@dataclass(frozen=True)
class MemoryBudget:
    """What predicted peak memory is compared against."""

    capacity_bytes: int
    margin: float = 0.05
    """Fraction of the device memory kept free (allocator fragmentation, runtime)."""
    dtype: str = "bf16"
    device: str | None = None
    """Device name (``cpu``, ``h100``...): picks the memory model's runtime allowance."""

    @property
    def usable_bytes(self) -> int:
        return int(self.capacity_bytes * (1.0 - self.margin))


def check_layout(
    layout: Layout,
    model: ModelConfig,
    *,
    world_size: int | None = None,
    global_batch: int | None = None,
    placement: Placement | None = None,
    memory: MemoryBudget | None = None,
) -> list[Reason]:
    """Every reason why ``layout`` cannot run ``model``; empty when it can.

    Structural rules always apply; ``world_size``/``global_batch`` when given; the TP
    placement rules with a ``placement``; the memory rule with a ``memory`` budget (it
    uses :func:`autotune.models.memory.estimate_memory`).
    """
    reasons: list[Reason] = []
    lay = layout
    if world_size is not None and lay.world_size != world_size:
        reasons.append(Reason("world_size", f"tp*pp*dp = {lay.tp}*{lay.pp}*{lay.dp} = "
                              f"{lay.world_size}, but the world size is {world_size}"))
    if global_batch is not None and lay.global_batch != global_batch:
        reasons.append(Reason("global_batch", f"dp*micro_batch*grad_accum = {lay.dp}*"
                              f"{lay.micro_batch}*{lay.grad_accum} = {lay.global_batch}, "
                              f"but the global batch is {global_batch}"))
    if model.n_head % lay.tp:
        reasons.append(Reason("tp_heads", f"tp={lay.tp} does not divide n_head={model.n_head}"))
    if model.kv_heads != model.n_head and model.kv_heads % lay.tp:
        reasons.append(Reason("tp_kv_heads",
                              f"tp={lay.tp} does not divide n_kv_head={model.kv_heads}"))
    if model.hidden % lay.tp:
        reasons.append(Reason("tp_hidden", f"tp={lay.tp} does not divide hidden={model.hidden}"))
    if model.ffn % lay.tp:
        reasons.append(Reason("tp_ffn", f"tp={lay.tp} does not divide ffn_hidden={model.ffn}"))
    if lay.pp > model.n_layer:
        reasons.append(Reason("pp_layers", f"pp={lay.pp} exceeds n_layer={model.n_layer}"))
    if lay.pp > 1 and lay.zero_stage >= 2:
        reasons.append(Reason("zero_pp", f"zero_stage={lay.zero_stage} with pp={lay.pp}: "
                              "DeepSpeed allows only ZeRO 0-1 with pipeline parallelism"))
    if placement is not None:
        reasons.extend(_placement_reasons(lay, placement))
    if memory is not None and not reasons:
        # Only a structurally valid layout has a meaningful memory prediction.
        from autotune.models.memory import estimate_memory  # local: keeps the trainer light

        est = estimate_memory(model, lay, dtype=memory.dtype, device=memory.device)
        if est.peak_bytes > memory.usable_bytes:
            reasons.append(Reason(
                "memory",
                f"predicted peak {est.peak_bytes / 2**30:.1f} GiB per device > "
                f"{memory.usable_bytes / 2**30:.1f} GiB usable "
                f"({memory.capacity_bytes / 2**30:.1f} GiB less {memory.margin:.0%} margin)",
            ))
    return reasons


def _placement_reasons(lay: Layout, placement: Placement) -> list[Reason]:
    reasons = []
    if lay.tp > placement.devices_per_node and not placement.allow_tp_across_nodes:
        reasons.append(Reason("tp_cross_node", f"tp={lay.tp} > {placement.devices_per_node} "
                              "devices per node (search.tp_across_nodes is false)"))
    elif (lay.tp > placement.devices_per_card and not placement.allow_tp_across_cards):
        reasons.append(Reason("tp_cross_card", f"tp={lay.tp} > {placement.devices_per_card} "
                              "devices per card (search.tp_across_cards is false)"))
    return reasons


@dataclass(frozen=True)
class Constraints:
    """Everything a study imposes on a layout, built once from its configs."""

    world_size: int
    global_batch: int
    placement: Placement | None
    """TP placement rules; ``None`` for a replayed table (it holds what ran)."""
    memory: MemoryBudget | None
    """The memory rule; ``None`` for a replayed table (it answers OOMs itself)."""

    @classmethod
    def from_configs(cls, cluster: ClusterConfig, training: TrainingConfig,
                     search: SearchConfig, trial: TrialConfig) -> Constraints:
        device = cluster.device_spec()
        return cls(
            world_size=cluster.world_size,
            global_batch=training.global_batch,
            placement=Placement(devices_per_node=cluster.devices_per_node,
                                devices_per_card=device.devices_per_card,
                                allow_tp_across_nodes=search.tp_across_nodes,
                                allow_tp_across_cards=search.tp_across_cards),
            memory=MemoryBudget(capacity_bytes=device.memory_bytes,
                                margin=trial.memory_margin, dtype=training.dtype,
                                device=cluster.device),
        )

    def structural_only(self) -> Constraints:
        """These constraints without the placement and memory rules: what a replayed table
        needs, since its rows say themselves what ran, what ran out of memory and what is
        no candidate at all (:class:`autotune.launchers.replay.ReplayLauncher`)."""
        return replace(self, placement=None, memory=None)

    def check(self, layout: Layout, model: ModelConfig) -> list[Reason]:
        """:func:`check_layout` under these constraints."""
        return check_layout(layout, model, world_size=self.world_size,
                            global_batch=self.global_batch, placement=self.placement,
                            memory=self.memory)
