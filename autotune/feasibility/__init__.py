"""The one feasibility check: can this layout run this model here, and if not, why?

The tuner (before proposing a trial), the planner (to rank the space), every launcher
(before spending device time) and the trainer (before building the model) call
:func:`check_layout`. It returns readable :class:`Reason` objects rather than raising, so
that callers can show *all* reasons at once (torchtitan's ``ParallelDims`` prints every
factor); an empty list means feasible.

>>> from autotune.config.model import MODEL_PRESETS
>>> from autotune.layout import Layout, needs_no_less_memory
>>> tiny = MODEL_PRESETS["tiny"]
>>> check_layout(Layout(tp=2, pp=2, dp=1, micro_batch=2, grad_accum=4), tiny, world_size=4)
[]
>>> [r.code for r in check_layout(Layout(tp=3, pp=2, dp=1, micro_batch=1, grad_accum=1,
...     zero_stage=2), tiny, world_size=4)]
['world_size', 'tp_heads', 'tp_hidden', 'tp_ffn', 'zero_pp']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.feasibility.strategies import (
    STRATEGY_REASON_CODES,
    DeepSpeedRuntime,
    strategy_reasons,
)
from autotune.hardware import GiB
from autotune.layout import Layout, needs_no_less_memory

if TYPE_CHECKING:  # the models stay out of the trainer's import path (see check_layout)
    from autotune.models.memory_uncertainty import MemoryVerdict
    from autotune.models.profile import LayerProfile

__all__ = ["Reason", "Placement", "MemoryBudget", "Constraints", "check_layout", "REASON_CODES"]

REASON_CODES: dict[str, str] = {
    "world_size": "tp*pp*dp differs from the world size",
    "global_batch": "dp*micro_batch*grad_accum differs from the global batch",
    "tp_heads": "tp does not divide the attention heads",
    "tp_kv_heads": "tp does not divide the key/value heads",
    "tp_hidden": "tp does not divide the hidden size",
    "tp_ffn": "tp does not divide the MLP size",
    "sp_seq_len": "sequence parallelism with tp not dividing the sequence length",
    "pp_layers": "more pipeline stages than layers",
    "zero_pp": "ZeRO-2/3 with pipeline parallelism (DeepSpeed refuses it)",
    "tp_cross_node": "tensor-parallel group spans nodes",
    "tp_cross_card": "tensor-parallel group spans cards",
    "memory": "predicted memory exceeds the device beyond its error bar",
    "oom_dominated": "a less memory-hungry sibling ran out of memory",
    **STRATEGY_REASON_CODES,
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
    """What predicted peak memory is compared against, and how sure it must be.

    The memory model's peak is a median with an error bar
    (:mod:`autotune.models.memory_uncertainty`); :meth:`verdict` turns it into a
    probability of fitting ``usable_bytes`` and a *fits* / *uncertain* / *exceeds*
    verdict. Only *exceeds* (``p_fit < min_p_fit``) excludes a layout.
    """

    capacity_bytes: int
    margin: float = 0.05
    """Fraction of the device memory kept free: the expected allocator fragmentation."""
    dtype: str = "bf16"
    device: str | None = None
    """Device name (``cpu``, ``h100``...): picks the memory model's runtime allowance."""
    min_p_fit: float = 0.025
    """``trial.memory_min_p_fit``: excluded below this probability of fitting."""
    correction: float = 1.0
    """Multiplicative correction of the predicted peak (measured / predicted), e.g. from
    a study's own measured peaks; 1 until something has been measured."""
    correction_sigma: float = 0.0
    """sd of ``ln(correction)``: how well the correction itself is known."""
    profile: LayerProfile | None = None
    """Measured layer bytes (the study's ``cluster.profile``): where it has a layout's
    layer shape, the memory model's stored activations per layer are the measured ones,
    with the measured error bar (:func:`autotune.models.memory.measured_layer_activation`).
    The ``correction`` applies on top, to the whole peak."""
    stack: str = "deepspeed"
    """The training stack that allocates (``training.stack``, resolved:
    :mod:`autotune.models.stacks`)."""
    grad_accum_dtype: str | None = None
    """DeepSpeed's gradient accumulation dtype where known (``training.grad_accum_dtype``):
    its optimizer wrapper's gradients (:func:`autotune.models.stacks.deepspeed_grad_bytes`)."""
    stage_corrections: tuple[tuple[int, float, float], ...] = ()
    """``(zero stage, correction, correction_sigma)``: a stage's own correction, which
    replaces the two above for its layouts (:mod:`autotune.models.calibration`)."""

    def correction_of(self, layout: Layout) -> tuple[float, float]:
        """The correction and its log-sd that apply to ``layout`` (its ZeRO stage's)."""
        for stage, correction, sigma in self.stage_corrections:
            if stage == layout.zero_stage:
                return correction, sigma
        return self.correction, self.correction_sigma

    @property
    def usable_bytes(self) -> int:
        return int(self.capacity_bytes * (1.0 - self.margin))

    @classmethod
    def for_study(cls, cluster: ClusterConfig, training: TrainingConfig,
                  trial: TrialConfig, *, profile: LayerProfile | None = None) -> MemoryBudget:
        """The budget a study's settings give (what :meth:`Constraints.from_configs` uses);
        ``profile``: the study's measured layer profile (:attr:`autotune.spec.StudySpec.
        profile`), if any."""
        from autotune.models.stacks import resolve_stack  # local: keeps the trainer light

        return cls(capacity_bytes=cluster.device_spec().memory_bytes,
                   margin=trial.memory_margin, dtype=training.dtype, device=cluster.device,
                   min_p_fit=trial.memory_min_p_fit, profile=profile,
                   stack=resolve_stack(training.stack, "builtin"),
                   grad_accum_dtype=training.grad_accum_dtype)

    def verdict(self, model: ModelConfig, layout: Layout) -> MemoryVerdict:
        """The memory check of a structurally valid ``layout``: the prediction, its error
        bar, ``P(peak <= usable_bytes)`` and the verdict (``docs/models.md``)."""
        from autotune.feasibility.memory_terms import stack_memory_terms
        from autotune.models.memory_uncertainty import (  # local: keeps the trainer light
            MemoryVerdict,
            classify_fit,
            fit_probability,
            log_sigma,
        )

        correction, correction_sigma = self.correction_of(layout)
        # Where it is unknown which stack runs (training.stack megatron-deepspeed-either),
        # P(fit) is the mixture's: the mean over the stacks it may be. The peak shown is
        # the first's (the larger states).
        each = stack_memory_terms(model, layout, dtype=self.dtype, device=self.device,
                                  profile=self.profile, stack=self.stack,
                                  grad_accum_dtype=self.grad_accum_dtype)
        p = sum(fit_probability(e.peak_bytes, self.usable_bytes, u.relative_sigma,
                                correction=correction, correction_sigma=correction_sigma)
                for e, u in each) / len(each)
        est, unc = each[0]
        s = log_sigma(unc.relative_sigma, correction_sigma)
        median = correction * est.peak_bytes
        # sd of a log-normal with median m and log-sd s: m * exp(s^2/2) * sqrt(exp(s^2) - 1)
        sigma = median * math.exp(s * s / 2) * math.sqrt(math.expm1(s * s))
        return MemoryVerdict(verdict=classify_fit(p, self.min_p_fit), p_fit=p,
                             predicted_bytes=est.peak_bytes, corrected_bytes=int(median),
                             sigma_bytes=int(sigma), log_sigma=s,
                             usable_bytes=self.usable_bytes, profiled=est.profiled)


def check_layout(
    layout: Layout,
    model: ModelConfig,
    *,
    world_size: int | None = None,
    global_batch: int | None = None,
    placement: Placement | None = None,
    memory: MemoryBudget | None = None,
    deepspeed: DeepSpeedRuntime | None = None,
) -> list[Reason]:
    """Every reason why ``layout`` cannot run ``model``; empty when it can.

    Structural rules always apply; ``world_size``/``global_batch`` when given; the TP
    placement rules with a ``placement``; the memory rule with a ``memory`` budget (it
    uses :func:`autotune.models.memory.estimate_memory`); the ZeRO-3 variants' and
    Ulysses' rules (:mod:`autotune.feasibility.strategies`) always, MiCS's DeepSpeed version with
    ``deepspeed``, the trials' DeepSpeed.
    """
    reasons: list[Reason] = []
    lay = layout
    if world_size is not None and lay.world_size != world_size:
        uly = ("*ulysses", f"*{lay.ulysses}") if lay.ulysses > 1 else ("", "")
        reasons.append(Reason("world_size", f"tp*pp*dp{uly[0]} = {lay.tp}*{lay.pp}*{lay.dp}"
                              f"{uly[1]} = {lay.world_size}, but the world size is "
                              f"{world_size}"))
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
    if lay.sequence_parallel and model.seq_len % lay.tp:
        # Each TP rank keeps seq_len/tp positions of the LayerNorm/dropout regions
        # (Korthikanti et al. 2022, section 4.2.2; Megatron splits dim 0 evenly).
        reasons.append(Reason("sp_seq_len", f"sequence_parallel with tp={lay.tp}: tp does not "
                              f"divide seq_len={model.seq_len}"))
    if lay.pp > model.n_layer:
        reasons.append(Reason("pp_layers", f"pp={lay.pp} exceeds n_layer={model.n_layer}"))
    if lay.pp > 1 and lay.zero_stage >= 2:
        reasons.append(Reason("zero_pp", f"zero_stage={lay.zero_stage} with pp={lay.pp}: "
                              "DeepSpeed allows only ZeRO 0-1 with pipeline parallelism"))
    reasons.extend(Reason(code, text) for code, text in strategy_reasons(lay, model, deepspeed))
    if placement is not None:
        reasons.extend(_placement_reasons(lay, placement))
    if memory is not None and not reasons:
        # Only a structurally valid layout has a meaningful memory prediction.
        fit = memory.verdict(model, lay)
        if fit.verdict.value == "exceeds":
            reasons.append(Reason("memory", _memory_message(fit, memory)))
    return reasons


def _memory_message(fit: MemoryVerdict, memory: MemoryBudget) -> str:
    return (f"predicted peak {fit.corrected_bytes / GiB:.1f} +- "
            f"{fit.sigma_bytes / GiB:.1f} GiB per device > "
            f"{memory.usable_bytes / GiB:.1f} GiB usable "
            f"({memory.capacity_bytes / GiB:.1f} GiB less {memory.margin:.0%} margin): "
            f"P(fit) {_percent(fit.p_fit)} < {_percent(memory.min_p_fit)}")


def _percent(p: float) -> str:
    """``0.0123`` → ``1.2%``; tiny probabilities stay readable (``<0.1%``)."""
    return "<0.1%" if 0 < p < 0.001 else f"{100 * p:.1f}%"


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
    deepspeed: DeepSpeedRuntime | None = None
    """The trials' DeepSpeed, where the space depends on it (MiCS); ``None``: unchecked."""

    @classmethod
    def from_configs(cls, cluster: ClusterConfig, training: TrainingConfig,
                     search: SearchConfig, trial: TrialConfig, *,
                     profile: LayerProfile | None = None,
                     deepspeed: DeepSpeedRuntime | None = None) -> Constraints:
        """A study's constraints; ``profile``: its measured layer profile, which the memory
        rule uses where it has a layout's layer bytes (:class:`MemoryBudget`);
        ``deepspeed``: the trials' DeepSpeed
        (:func:`autotune.workloads.deepspeed_version.deepspeed_for_study`)."""
        device = cluster.device_spec()
        return cls(
            world_size=cluster.world_size,
            global_batch=training.global_batch,
            placement=Placement(devices_per_node=cluster.devices_per_node,
                                devices_per_card=device.devices_per_card,
                                allow_tp_across_nodes=search.tp_across_nodes,
                                allow_tp_across_cards=search.tp_across_cards),
            memory=MemoryBudget.for_study(cluster, training, trial, profile=profile),
            deepspeed=deepspeed,
        )

    def structural_only(self) -> Constraints:
        """These constraints without the placement and memory rules: what a replayed table
        needs, since its rows say themselves what ran, what ran out of memory and what is
        no candidate at all (:class:`autotune.launchers.replay.ReplayLauncher`)."""
        return replace(self, placement=None, memory=None, deepspeed=None)

    def with_memory_correction(self, correction: float, sigma: float, *,
                               by_stage: tuple[tuple[int, float, float], ...] = ()
                               ) -> Constraints:
        """These constraints with the memory budget's calibration correction and its log-sd,
        and per ZeRO stage (:mod:`autotune.models.calibration`); unchanged without a
        memory rule."""
        if self.memory is None:
            return self
        return replace(self, memory=replace(self.memory, correction=correction,
                                            correction_sigma=sigma,
                                            stage_corrections=by_stage))

    def check(self, layout: Layout, model: ModelConfig) -> list[Reason]:
        """:func:`check_layout` under these constraints."""
        return check_layout(layout, model, world_size=self.world_size,
                            global_batch=self.global_batch, placement=self.placement,
                            memory=self.memory, deepspeed=self.deepspeed)

    def measured_headrooms(self, model: ModelConfig, layouts: Iterable[Layout]
                           ) -> dict[Layout, float]:
        """Each measured layout's headroom in sds
        (:attr:`~autotune.models.memory_uncertainty.MemoryVerdict.headroom_sd`) for
        :meth:`memory_verdict`, computed once for a whole ranking (empty without a rule)."""
        if self.memory is None:
            return {}
        return {lay: self.memory.verdict(model, lay).headroom_sd for lay in set(layouts)}

    def memory_verdict(self, layout: Layout, model: ModelConfig, *,
                       ooms: Iterable[Layout] = (), fits: Iterable[Layout] = (),
                       headrooms: Mapping[Layout, float] | None = None,
                       ) -> MemoryVerdict | None:
        """The memory verdict of ``layout`` (``None`` without a memory rule).

        ``ooms``: layouts measured to run out of memory. One that ``layout`` needs no less
        memory than (:func:`autotune.layout.needs_no_less_memory`) makes it *exceeds*
        with ``p_fit = 0`` (``oom`` names it); a sibling that needs less (same tp and pp)
        lowers its ``p_fit`` by conditioning on the shared error
        (:func:`~autotune.models.memory_uncertainty.oom_conditioned_p_fit`). ``fits``:
        layouts measured to run, the mirror: one that needs no less memory than
        ``layout`` makes it fit (``p_fit = 1``), a sibling with less headroom raises its
        ``p_fit`` (:func:`~autotune.models.memory_uncertainty.run_conditioned_p_fit`).
        ``headrooms``: :meth:`measured_headrooms` of the measured layouts, where a ranking
        asks for many verdicts. The verdict does not check the structural rules:
        :meth:`check` does.
        """
        memory = self.memory
        if memory is None:
            return None
        fit = memory.verdict(model, layout)
        ooms, fits = list(ooms), list(fits)
        if not ooms and not fits:
            return fit
        from autotune.models.memory_uncertainty import (
            FitVerdict,
            classify_fit,
            oom_conditioned_p_fit,
            run_conditioned_p_fit,
        )
        for oom in ooms:
            if needs_no_less_memory(layout, oom):
                return replace(fit, verdict=FitVerdict.EXCEEDS, p_fit=0.0, oom=oom.key())
        if any(needs_no_less_memory(ran, layout) for ran in fits):
            return replace(fit, verdict=FitVerdict.FITS, p_fit=1.0)

        def siblings(measured: list[Layout]) -> list[float]:
            return [headrooms[m] if headrooms is not None and m in headrooms
                    else memory.verdict(model, m).headroom_sd
                    for m in measured if m.tp == layout.tp and m.pp == layout.pp]

        # With one shared error, the most surprising OOM (the most headroom) and the most
        # surprising run (the least) say the most.
        low, high = siblings(ooms), siblings(fits)
        if not low and not high:
            return fit
        if not high:
            p = min(fit.p_fit, oom_conditioned_p_fit(fit.headroom_sd, max(low)))
        elif not low:
            # A run only adds evidence of fitting: never below the unconditioned mixture.
            p = max(fit.p_fit, run_conditioned_p_fit(fit.headroom_sd, min(high)))
        else:
            p = run_conditioned_p_fit(fit.headroom_sd, min(high), max(low))
        return replace(fit, p_fit=p, verdict=classify_fit(p, memory.min_p_fit))
