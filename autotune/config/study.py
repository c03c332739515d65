"""The per-concern configs of a study file other than model and cluster.

Each dataclass validates itself; ``from_dict`` refuses unknown keys so that a typo in a
study file is an error, not a silently ignored setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config import run_defaults as run
from autotune.config._fields import (
    check_choice,
    check_float,
    check_int,
    check_keys,
    check_list,
)
from autotune.config._strategy_axes import check_strategy_axes, parse_strategy_axes
from autotune.config.cluster import MAX_DEVICES_PER_NODE, MAX_NODES
from autotune.config.run_defaults import MAX_STEPS
from autotune.config.storage import StorageConfig
from autotune.errors import SpecError
from autotune.layout import RECOMPUTE_CHOICES, ZERO_STAGES
from autotune.objective import OBJECTIVES

__all__ = ["TrainingConfig", "SearchConfig", "TrialConfig", "StorageConfig",
           "STRATEGIES", "AUTO", "check_min_improvement", "check_fp16_replay"]

AUTO = "auto"
STRATEGIES: tuple[str, ...] = ("default", "cost-model-only", "tpe", "gp", "random", "grid")

# Upper bounds: generous for real use, and low enough that no value makes the
# planner enumerate for long, a float overflow or a timer refuse its timeout.
MAX_GLOBAL_BATCH = 10_000_000
"""Most sequences per step (GPT-3: 1,536; Llama 3 405B: 16M tokens = 2,048 sequences)."""
MAX_DEGREE = MAX_NODES * MAX_DEVICES_PER_NODE
"""Largest tp/pp value listed: the largest world size."""
MAX_N_TRIALS = 1_000_000
MAX_SEED = 2**32 - 1
"""NumPy's (and so Optuna's samplers') largest seed."""
MAX_RUN_TIMEOUT_S = 366 * 86_400
"""Longest ``search.timeout_s``: a year."""
MAX_TRIAL_TIMEOUT_S = 30 * 86_400
"""Longest ``trial.timeout_s`` and ``trial.collective_timeout_s``: 30 days."""
MAX_CONFIRM = 16
"""Most layouts in a confirmation round (each round measures every one of them)."""
MAX_CONFIRM_ROUNDS = 100
MAX_CONFIRM_BUDGET = 100.0
"""Largest ``search.confirm_budget``: a hundred times the search's device-seconds."""


def _int_list(field_name: str, value: Any, *, minimum: int = 1, maximum: int | None = None,
              allow_auto: bool = True) -> tuple[int, ...] | str:
    if allow_auto and value == AUTO:
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        allowed = "'auto' or " if allow_auto else ""
        raise SpecError(field_name, value, f"allowed: {allowed}a non-empty list of integers")
    check_list(field_name, value)
    return tuple(sorted({check_int(f"{field_name}[{i}]", v, minimum=minimum, maximum=maximum)
                         for i, v in enumerate(value)}))


def check_min_improvement(value: Any, strategy: str) -> float:
    """``search.min_improvement`` (not null): a fraction in [0, 1), for ``default`` only."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0.0 <= value < 1.0:
        raise SpecError("search.min_improvement", value,
                        "allowed: a fraction >= 0 and < 1 (0.01 = 1%), or null (off)")
    if strategy != "default":
        raise SpecError("search.min_improvement", value,
                        f"allowed: null with strategy {strategy!r} (only 'default' estimates "
                        "the expected improvement it is compared with)")
    return float(value)


TRAINING_STACKS: tuple[str, ...] = ("auto", "deepspeed", "deepspeed-fused-adam", "megatron",
                                     "megatron-distributed", "megatron-deepspeed-either")
"""``training.stack`` values (``autotune/models/stacks.py`` says what each allocates)."""


@dataclass(frozen=True)
class TrainingConfig:
    """What one optimizer step is."""

    global_batch: int
    """Sequences per optimizer step (= dp * micro_batch * grad_accum for every layout)."""
    dtype: str = "bf16"
    """``bf16`` on accelerators; ``fp32`` for CPU studies (bf16 is 3-4x slower there).
    ``fp16`` only with ``launcher.kind: replay``, for a table measured in fp16 (vTrain's):
    the memory model then predicts fp16's optimizer (no fp32 gradient buffer; its step's
    fp32 copies of the gradients) at the BF16 peak; no workload runs loss-scaled fp16."""
    stack: str = "auto"
    """The training stack whose allocations the memory model predicts: ``deepspeed``
    (DeepSpeed's engine with torch's AdamW, the built-in trainer), ``deepspeed-fused-adam``
    (DeepSpeed's engine with a fused Adam: Megatron-DeepSpeed with ``--deepspeed``),
    ``megatron`` (Megatron's own mixed-precision optimizer, no DeepSpeed engine: 18 bytes
    per parameter in bf16), ``megatron-distributed`` (with
    ``--use-distributed-optimizer``: 6 + 12/dp) or ``megatron-deepspeed-either``
    (Megatron-DeepSpeed, not knowing which of ``deepspeed-fused-adam`` and ``megatron``
    ran: P(fit) is the mean of the two). Every stack but ``deepspeed`` ties the output
    layer to the embedding, as Megatron's GPT does. ``auto``: the workload's (``builtin``:
    deepspeed; ``megatron-deepspeed``: deepspeed-fused-adam; ``command``: deepspeed), or
    with ``launcher.kind: replay`` the table's (vTrain's format: megatron-deepspeed-either;
    the Aurora format's: deepspeed-fused-adam)."""
    grad_accum_dtype: str | None = None
    """Filled by the loader: DeepSpeed's gradient accumulation dtype where autotune writes
    the trials' DeepSpeed config (:func:`autotune.models.stacks.known_grad_accum_dtype`),
    which picks the engine's optimizer wrapper; ``None``: not known."""

    def __post_init__(self) -> None:
        check_int("training.global_batch", self.global_batch, maximum=MAX_GLOBAL_BATCH)
        check_choice("training.dtype", self.dtype, ("bf16", "fp32", "fp16"))
        check_choice("training.stack", self.stack, TRAINING_STACKS)

    @classmethod
    def from_dict(cls, data: Any) -> TrainingConfig:
        data = check_keys("training", data, ("global_batch", "dtype", "stack"))
        if "global_batch" not in data:
            raise SpecError("training.global_batch", None, "required: sequences per step")
        return cls(**data)


def check_fp16_replay(dtype: str, launcher_kind: str) -> None:
    """``training.dtype: fp16`` only where no trial trains: a replayed table measured in
    fp16. Neither the built-in trainer nor autotune's Megatron-DeepSpeed or DeepSpeed
    configs run loss-scaled fp16. (Not a validator the study-file reference reads: the
    field's docstring says it.)"""
    if dtype == "fp16" and launcher_kind != "replay":
        raise SpecError("training.dtype", dtype,
                        "allowed: one of 'bf16', 'fp32'; 'fp16' only with launcher.kind: "
                        f"replay (a table measured in fp16), not with {launcher_kind!r}: "
                        "no workload autotune launches runs loss-scaled fp16")


@dataclass(frozen=True)
class SearchConfig:
    """The layout space and how to search it."""

    tp: tuple[int, ...] | str = AUTO
    """Tensor-parallel degrees, or ``auto`` (every divisor of the world size)."""
    pp: tuple[int, ...] | str = AUTO
    """Pipeline degrees, or ``auto`` (every divisor of the world size)."""
    micro_batch: tuple[int, ...] | str = AUTO
    """Micro-batch sizes, or ``auto`` (1, 2, 4, ... up to the largest that fits the batch)."""
    zero_stage: tuple[int, ...] = (0, 1)
    """ZeRO stages to try (2 and 3 only combine with pp = 1)."""
    recompute: tuple[str, ...] = ("none", "full")
    """Activation recomputation choices: ``none``, ``selective`` (only the attention core,
    Korthikanti et al. 2022, section 5) and ``full`` (every layer)."""
    sequence_parallel: tuple[bool, ...] = (False,)
    """Sequence parallelism choices (``[false, true]`` makes it an axis; Korthikanti et al.
    2022, section 4.2.2). ``true`` only applies to layouts with ``tp > 1``: a ``tp = 1``
    layout is enumerated once, without it."""
    zero_variant: tuple[str, ...] = ("none",)
    """ZeRO-3 variants: ``none``, ``mics`` (Zhang et al. 2022), ``hpz`` (ZeRO++, Wang et
    al. 2023); the variants only with 3 in ``zero_stage`` (docs/models.md)."""
    zero_shard_size: tuple[int, ...] | None = None
    """MiCS shard / hpZ partition sizes (>= 2); ``null``: the devices of a node."""
    ulysses: tuple[int, ...] = (1,)
    """DeepSpeed-Ulysses degrees (Jacobs et al. 2023); multiply into the world size."""
    tp_across_nodes: bool = False
    """Allow TP groups to span nodes (slow: LRZ; Narayanan et al. 2021, fig. 13)."""
    tp_across_cards: bool = True
    """Allow TP groups to span cards of one node (false: TP only between tiles of a card)."""
    strategy: str = "default"
    """How layouts are proposed; see ``docs/search.md``."""
    n_trials: int = 10
    """Measured trials to run (the budget); infeasible proposals do not count."""
    min_improvement: float | None = None
    """Stop before the budget once the largest expected relative improvement over the best
    measured throughput, among the untried layouts, is below this fraction (0.01 = 1%).
    ``default`` strategy only (the others estimate no expected improvement: an
    error, not a silently ignored setting); never before its seed trials nor without a
    measured value. Off (``null``) by default: the budget is the user's, and the
    expectation is only as good as the cost model. On the vTrain landscapes 0.01 spends
    27% fewer trials of a 10-trial budget at no loss with the real cost model, but with
    the cost model ~20% wrong per axis value it misses a near-best layout in 8% of the
    runs where the full budget finds one (docs/search.md). Worth setting where the cost
    model is known to rank the system well and trials are expensive."""
    timeout_s: float | None = None
    """Wall-time budget for the whole run, in seconds."""
    seed: int = 0
    """Sampler seed."""
    objective: str = "throughput"
    """Which measured layout is named best (``autotune.objective``): ``throughput`` (the
    highest model TFLOPS per device), ``energy`` (the fewest joules per token) or
    ``throughput-within`` (the fewest joules per token within ``throughput_within`` of
    the best throughput). The search proposes by predicted throughput either way; where
    no trial measured energy, the energy objectives name the fastest and say "energy:
    not measured (no counter)"."""
    throughput_within: float = 0.05
    """With ``objective: throughput-within``: how far below the best throughput a layout
    may be (a fraction: 0.05 = 5%)."""
    learn_from_database: bool = True
    """Warm-start the memory and step-time corrections from the ``measurements`` of earlier
    studies of the same device type, dtype and workload in the study's database
    (docs/models.md, "Calibration from measurements"). ``false`` (or ``--no-learn``)
    starts from the models alone; the study still calibrates on its own trials."""
    stop_on_repeated_error: int = 2
    """Stop the study when this many trials in a row, on different layouts, failed with
    the same error (the program's own error line; never an out-of-memory): then the
    program or its arguments are broken, not the layouts (a misspelled flag would spend the
    whole budget). A resumed study that still ends on that error asks for
    ``--retry-failed`` or a changed study file first (:mod:`autotune.runner.stop_early`).
    ``0``: never stop."""
    confirm: int = 3
    """The confirmation round (docs/guide.md, "The confirmation round"): before the study
    names its best, the best and the measured layouts whose intervals (each trial's
    measured precision, else ``trial.measure_precision``) overlap its interval, this many
    at most, are measured again side by side, interleaved (A B, B A, ...), never stopped
    early, until the paired interval of best / runner-up tells them apart or shows them
    equivalent, or ``confirm_max_rounds`` or ``confirm_budget`` ends it. Its runs are no
    trials of the budget. ``0`` or ``false`` (``run --no-confirm``): off (the single pass
    names the best); else 2 to 16 layouts."""
    confirm_max_rounds: int = 12
    """The most paired rounds of the confirmation round (2 at least: one A B, B A pair)."""
    confirm_budget: float = 0.25
    """The device-seconds the confirmation round may spend, as a fraction of what the
    study's trials spent (``run --confirm-budget``). Where each run is its own launch, the
    round plans the rounds it affords (at most ``confirm_max_rounds``) and decides on
    them. A step of rounds that would exceed it is not started: the verdict is then "not
    decided within the budget" and the single pass's best stands. ``0``: the round never
    measures."""

    def __post_init__(self) -> None:
        if (isinstance(self.confirm, bool) or not isinstance(self.confirm, int)
                or self.confirm == 1 or not 0 <= self.confirm <= MAX_CONFIRM):
            raise SpecError("search.confirm", self.confirm,
                            f"allowed: 0 or false (off), or an integer 2..{MAX_CONFIRM} (the "
                            "best and its rivals: 1 would compare the best with nothing)")
        check_int("search.confirm_max_rounds", self.confirm_max_rounds, minimum=2,
                  maximum=MAX_CONFIRM_ROUNDS)
        check_float("search.confirm_budget", self.confirm_budget, maximum=MAX_CONFIRM_BUDGET)
        stop = self.stop_on_repeated_error
        if isinstance(stop, bool) or not isinstance(stop, int) or not (
                stop == 0 or 2 <= stop <= MAX_N_TRIALS):
            raise SpecError("search.stop_on_repeated_error", stop,
                            f"allowed: 0 or false (never stop), or an integer 2..{MAX_N_TRIALS} "
                            "(1 would stop at the first failure)")
        for i, z in enumerate(self.zero_stage):
            check_choice(f"search.zero_stage[{i}]", z, ZERO_STAGES)
        for i, r in enumerate(self.recompute):
            check_choice(f"search.recompute[{i}]", r, RECOMPUTE_CHOICES)
        for i, sp in enumerate(self.sequence_parallel):
            if not isinstance(sp, bool):
                raise SpecError(f"search.sequence_parallel[{i}]", sp, "allowed: true or false")
        check_strategy_axes(self.zero_variant, self.zero_shard_size, self.ulysses,
                            self.zero_stage, self.sequence_parallel)
        check_choice("search.strategy", self.strategy, STRATEGIES)
        check_int("search.n_trials", self.n_trials, maximum=MAX_N_TRIALS)
        if self.min_improvement is not None:
            check_min_improvement(self.min_improvement, self.strategy)
        check_int("search.seed", self.seed, minimum=0, maximum=MAX_SEED)
        check_choice("search.objective", self.objective, OBJECTIVES)
        if check_float("search.throughput_within", self.throughput_within) >= 1.0:
            raise SpecError("search.throughput_within", self.throughput_within,
                            "allowed: a fraction >= 0 and < 1 (0.05 = 5%)")
        if self.timeout_s is not None:
            check_float("search.timeout_s", self.timeout_s, strict=True,
                        maximum=MAX_RUN_TIMEOUT_S)
        for name in ("tp_across_nodes", "tp_across_cards", "learn_from_database"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"search.{name}", getattr(self, name), "allowed: true or false")

    @classmethod
    def from_dict(cls, data: Any) -> SearchConfig:
        data = dict(check_keys("search", data, cls.__dataclass_fields__))
        for off in ("confirm", "stop_on_repeated_error"):
            if data.get(off) is False:
                data[off] = 0  # "confirm: false" reads as off, like 0
        for axis, top in (("tp", MAX_DEGREE), ("pp", MAX_DEGREE),
                          ("micro_batch", MAX_GLOBAL_BATCH)):
            if axis in data:
                data[axis] = _int_list(f"search.{axis}", data[axis], maximum=top)
        if "zero_stage" in data:
            data["zero_stage"] = _int_list("search.zero_stage", data["zero_stage"], minimum=0,
                                           allow_auto=False)
        if "recompute" in data:
            rec = data["recompute"]
            rec = [rec] if isinstance(rec, str) else rec
            if not isinstance(rec, list) or not rec:
                raise SpecError("search.recompute", rec,
                                "allowed: a list of 'none'/'selective'/'full'")
            for i, r in enumerate(check_list("search.recompute", rec)):
                check_choice(f"search.recompute[{i}]", r, RECOMPUTE_CHOICES)
            data["recompute"] = tuple(dict.fromkeys(rec))
        if "sequence_parallel" in data:
            sp = data["sequence_parallel"]
            sp = [sp] if isinstance(sp, bool) else sp
            if not isinstance(sp, list) or not sp:
                raise SpecError("search.sequence_parallel", sp,
                                "allowed: true, false or a list of them")
            for i, v in enumerate(check_list("search.sequence_parallel", sp)):
                if not isinstance(v, bool):
                    raise SpecError(f"search.sequence_parallel[{i}]", v,
                                    "allowed: true or false")
            data["sequence_parallel"] = tuple(dict.fromkeys(sp))
        parse_strategy_axes(data, max_degree=MAX_DEGREE)
        return cls(**data)


@dataclass(frozen=True)
class TrialConfig:
    """How each measured trial runs."""

    warmup_steps: int = run.WARMUP_STEPS
    """Untimed optimizer steps."""
    measure_steps: int = run.MEASURE_STEPS
    """Timed optimizer steps (median reported); with ``measure_precision``, the fewest."""
    measure_precision: float | None = run.MEASURE_PRECISION
    """Measure each layout until its median step time is known to this relative precision
    (half-width of the distribution-free 95% interval of the median, from order statistics:
    at least 6 timed steps) or ``max_measure_steps`` is reached; the precision reached is
    stored with the measurement. ``null``: exactly ``measure_steps`` steps. A user's
    program (``workload.kind`` ``command`` or ``megatron-deepspeed``) is started with the
    cap and stopped by autotune once its median is known (docs/own-command.md)."""
    max_measure_steps: int | None = None
    """The step cap with ``measure_precision`` (at least ``measure_steps``). ``null``: the
    larger of 12 and ``measure_steps``."""
    early_stop_tolerance: float | None = None
    """Stop a layout once its first timed steps show, at 95% confidence (a lower bound of
    the median step time), that its throughput cannot come within this fraction of the
    best measured so far (0.1: 10%); it is recorded with outcome ``stopped`` and its
    measurement (a low value the search learns from, not a failure). Needs
    ``measure_precision`` (6 timed steps at least before a verdict, so that a stopped
    layout's measurement has a precision). ``null``: off, every
    layout is measured to the end."""
    batch_size: int = 4
    """Layouts measured in one launch (they share the world size): the launch's start-up
    (process start, imports, rendezvous, communicator set-up) is paid once per batch.
    A crash or hang ends the launch; the layouts it had not finished are measured again,
    each alone. 1: one launch per layout (a user's program always runs alone)."""
    timeout_s: float = 600.0
    """Per-trial wall-time limit; the trial's whole process group is killed past it (in a
    batch: when this long passes without a layout finishing)."""
    memory_margin: float = 0.05
    """Fraction of device memory the memory model keeps free: the expected allocator
    fragmentation. What the prediction may be off by beyond that is its error bar
    (``memory_min_p_fit``; docs/models.md, "Memory: prediction, uncertainty, verdict")."""
    memory_min_p_fit: float = 0.025
    """A layout is excluded on memory only when its probability of fitting the device is
    below this (0.025: beyond about 2 sd of the prediction's error bar); layouts between
    this and ``1 - memory_min_p_fit`` are *uncertain*: they stay candidates and the search
    weighs their predicted throughput by the probability. A layout wrongly excluded can
    never be found, while one that runs out of memory costs one short trial and rules out
    its hungrier siblings. 0 never excludes on the prediction alone."""
    collective_timeout_s: int = run.COLLECTIVE_TIMEOUT_S
    """Process-group timeout inside the trial (a dead rank cannot block the others)."""
    device: str = run.DEVICE
    """Trainer device: ``auto``, ``cpu``, ``cuda``, ``xpu``."""

    def __post_init__(self) -> None:
        check_int("trial.warmup_steps", self.warmup_steps, minimum=0, maximum=MAX_STEPS)
        check_int("trial.measure_steps", self.measure_steps, maximum=MAX_STEPS)
        if self.measure_precision is not None:
            check_float("trial.measure_precision", self.measure_precision, strict=True,
                        maximum=1.0)
        if self.max_measure_steps is not None:
            check_int("trial.max_measure_steps", self.max_measure_steps, maximum=MAX_STEPS)
        if (self.measure_precision is not None and self.max_measure_steps is not None
                and self.max_measure_steps < self.measure_steps):
            raise SpecError("trial.max_measure_steps", self.max_measure_steps,
                            f"allowed: at least trial.measure_steps ({self.measure_steps})")
        if self.early_stop_tolerance is not None:
            check_float("trial.early_stop_tolerance", self.early_stop_tolerance, strict=True,
                        maximum=0.99)
            if self.measure_precision is None:
                raise SpecError("trial.early_stop_tolerance", self.early_stop_tolerance,
                                "allowed: null when trial.measure_precision is null (a "
                                "fixed step count is never cut short)")
        check_int("trial.batch_size", self.batch_size, maximum=64)
        check_float("trial.timeout_s", self.timeout_s, strict=True, maximum=MAX_TRIAL_TIMEOUT_S)
        check_float("trial.memory_margin", self.memory_margin, maximum=0.9)
        if check_float("trial.memory_min_p_fit", self.memory_min_p_fit) >= 0.5:
            raise SpecError("trial.memory_min_p_fit", self.memory_min_p_fit,
                            "allowed: a probability >= 0 and < 0.5 (0.025 = 2.5%)")
        check_int("trial.collective_timeout_s", self.collective_timeout_s,
                  maximum=MAX_TRIAL_TIMEOUT_S)
        check_choice("trial.device", self.device, run.DEVICES)

    @classmethod
    def from_dict(cls, data: Any) -> TrialConfig:
        return cls(**check_keys("trial", data, cls.__dataclass_fields__))
