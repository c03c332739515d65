"""Which training stack allocates the model states, and how: the per-stack memory terms.

The same layout allocates differently under different training stacks; the memory model
(:func:`autotune.models.memory.estimate_memory`) asks this module for the terms that
differ. A study says which stack runs (``training.stack``; ``auto`` resolves from its
workload: :func:`resolve_stack`), a replayed table which stack measured it.

``deepspeed``
    DeepSpeed's engine with ``torch.optim.AdamW``, as the built-in trainer runs it
    (``trainer/engine.py``: ``"torch_adam": true``): ZeRO's model states with DeepSpeed's
    optimizer wrappers (:func:`autotune.models.memory.model_state_bytes`), its gradient
    buckets, and the ``sqrt(v)`` temporary of torch's multi-tensor AdamW
    (:func:`autotune.models.memory.optimizer_temp_bytes`).
``deepspeed-fused-adam``
    DeepSpeed's engine with a fused Adam, as Megatron-DeepSpeed runs under ``--deepspeed``
    (``megatron/optimizer/__init__.py`` ``get_megatron_optimizer``: apex's ``FusedAdam`` on
    CUDA, DeepSpeed's with ``--ds-fused-adam``, handed to ``deepspeed.initialize``;
    deepspeedai/Megatron-DeepSpeed@4efb479). A fused Adam updates the states in place in
    one multi-tensor kernel: no per-parameter temporary.
``megatron``
    Megatron's own mixed-precision optimizer, no DeepSpeed engine
    (``Float16OptimizerWithFloat16Params``, ``megatron/optimizer/optimizer.py``): 16-bit
    weights (2 bytes), gradients accumulated in the local DDP's contiguous fp32 buffer,
    ``param.main_grad`` (4 bytes: bf16 forces ``accumulate_allreduce_grads_in_fp32``,
    ``megatron/arguments.py``; ``MemoryBuffer`` in ``megatron/model/distributed.py``),
    which is all-reduced in place (no separate bucket), an fp32 main copy of the weights
    and Adam's two fp32 moments (12 bytes): 18 bytes per parameter, none sharded. fp32
    training: 4 + 4 + 8 (the weights are their own main copy).
``megatron-distributed``
    The same with ``--use-distributed-optimizer`` (``DistributedOptimizer``,
    ``megatron/optimizer/distrib_optimizer.py``: each data-parallel rank keeps the fp32
    main copy and Adam states of its ``1/dp`` shard of the grad buffer): 2 + 4 + 12/dp.

``megatron-deepspeed-either``
    Megatron-DeepSpeed where it is not known which of the two ran: under DeepSpeed's
    engine (``deepspeed-fused-adam``) or on Megatron's own optimizer (``megatron``); the
    code base runs both, and a table of its measurements need not say which (vTrain's
    does not: ``data/landscapes/README.md``). The memory check's P(fit) is the average of
    the two stacks' (:data:`EITHER_STACKS`, equally likely: :func:`memory_stacks`); the
    peak it shows and the step time are the DeepSpeed engine's, the larger states.

Megatron's own optimizer has no ZeRO: under the two ``megatron`` stacks the layout's
``zero_stage`` does not change what is allocated.

Every stack but ``deepspeed`` runs Megatron's GPT, which ties the output layer to the word
embedding (:func:`ties_embeddings`); the built-in trainer unties them.
"""

from __future__ import annotations

from typing import Any

from autotune.config.study import TRAINING_STACKS
from autotune.layout import Layout
from autotune.models.activations import dtype_bytes

__all__ = ["STACKS", "AUTO", "EITHER", "EITHER_STACKS", "REPLAY_STACK", "resolve_stack",
           "memory_stacks", "ties_embeddings", "megatron_state_bytes",
           "megatron_grad_bytes", "dp_reduce_bytes_per_param", "has_torch_adam_temp",
           "has_deepspeed_buckets", "is_megatron", "known_grad_accum_dtype",
           "deepspeed_grad_bytes", "deepspeed_step_excess_bytes", "megatron_step_excess_bytes",
           "step_excess_bytes"]

AUTO = "auto"
STACKS: tuple[str, ...] = tuple(s for s in TRAINING_STACKS if s != AUTO)

_BY_WORKLOAD: dict[str, str] = {
    "builtin": "deepspeed",
    # autotune's Megatron-DeepSpeed trials always pass --deepspeed
    # (autotune.workloads.megatron.trial_args).
    "megatron-deepspeed": "deepspeed-fused-adam",
    # A program of the user's own: the conservative states (the DeepSpeed engine with the
    # temporaries); training.stack says otherwise.
    "command": "deepspeed",
}


EITHER = "megatron-deepspeed-either"
EITHER_STACKS: tuple[str, ...] = ("deepspeed-fused-adam", "megatron")
"""What :data:`EITHER` may be: Megatron-DeepSpeed under DeepSpeed's engine (``--deepspeed``)
or on Megatron's own optimizer, the conservative one first."""

REPLAY_STACK = "deepspeed-fused-adam"
"""The stack that measured a replayed table whose format names its optimizer: ALCF's
AuroraGPT notes are Megatron-DeepSpeed runs under DeepSpeed's engine (their rows give the
ZeRO stage). A format that does not say (vTrain's) measured :data:`EITHER`: the loader
gives each group's (:attr:`autotune.landscape.LandscapeGroup.stack`)."""


def resolve_stack(stack: str, workload_kind: str, *, replay: bool = False,
                  table_stack: str | None = None) -> str:
    """``stack`` itself, or for ``auto`` the stack ``workload_kind`` runs (with ``replay``,
    the replayed table's: ``table_stack``, else :data:`REPLAY_STACK`).

    >>> resolve_stack("auto", "megatron-deepspeed"), resolve_stack("megatron", "builtin")
    ('deepspeed-fused-adam', 'megatron')
    """
    if stack != AUTO:
        return stack
    if replay:
        return table_stack or REPLAY_STACK
    return _BY_WORKLOAD.get(workload_kind, "deepspeed")


_MEGATRON_GPT = ("deepspeed-fused-adam", "megatron", "megatron-distributed", EITHER)
"""The stacks that run Megatron's GPT (:func:`ties_embeddings`)."""


def memory_stacks(stack: str) -> tuple[str, ...]:
    """The stacks whose P(fit) the memory check averages: :data:`EITHER_STACKS` for
    :data:`EITHER` (which one ran is unknown; each equally likely, so the probability of
    fitting is the mixture's, ``(P_1 + P_2) / 2``), else ``stack`` alone.

    >>> memory_stacks(EITHER), memory_stacks("megatron")
    (('deepspeed-fused-adam', 'megatron'), ('megatron',))
    """
    return EITHER_STACKS if stack == EITHER else (stack,)


def ties_embeddings(stack: str) -> bool:
    """Whether the output layer shares the word embedding's weight: in Megatron's GPT,
    unless ``--untie-embeddings-and-output-weights`` (default off; ``GPTModel.__init__``,
    ``share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights``,
    deepspeedai/Megatron-DeepSpeed@4efb479 ``megatron/model/gpt_model.py`` and
    ``megatron/arguments.py``; autotune's Megatron-DeepSpeed trials do not pass it), so
    a rank holding both ends (no pipeline) keeps one ``V x h`` matrix, not two. With a
    pipeline the last stage keeps its own copy of the embedding for the output layer,
    kept equal by an all-reduce of its gradient (the same file): the stages' counts are
    unchanged. The built-in trainer (``deepspeed``) and a user's program, which it
    stands for, untie them (``trainer/model.py``), as does an unresolved ``auto``."""
    return stack in _MEGATRON_GPT


def is_megatron(stack: str) -> bool:
    """Whether Megatron's own optimizer holds the model states (no DeepSpeed engine)."""
    return stack in ("megatron", "megatron-distributed")


def hides_tp_backward(stack: str, sequence_parallel: bool) -> bool:
    """Whether the stack's column-parallel linears run their backward's TP collective
    beside their own backward GEMMs (:func:`autotune.models.communication.
    tp_hidden_time_s`). Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``
    does: with sequence parallelism always (its reduce-scatter and re-gather are issued
    with ``async_op=True``), without it where ``async_tensor_model_parallel_allreduce``
    is on, which ``megatron/arguments.py`` turns off under ``--deepspeed`` ("DeepSpeed
    seems to be incompatible with async_tensor_model_parallel_allreduce") and leaves on
    by default otherwise (deepspeedai/Megatron-DeepSpeed@4efb479). So: with sequence
    parallelism every stack that runs Megatron's GPT; without it Megatron's own optimizer
    only (:data:`EITHER`'s step time is the DeepSpeed engine's). The built-in trainer
    (``deepspeed``) waits for each collective.

    >>> [hides_tp_backward(s, sp) for s, sp in (("megatron", False),
    ...  ("deepspeed-fused-adam", False), ("deepspeed-fused-adam", True), ("deepspeed", True))]
    [True, False, True, False]
    """
    if sequence_parallel:
        return stack in _MEGATRON_GPT
    return is_megatron(stack)


def megatron_grad_bytes(dtype: str) -> int:
    """Bytes per parameter of Megatron's contiguous gradient buffer (``param.main_grad``):
    fp32 with bf16 (``megatron/arguments.py`` forces ``accumulate_allreduce_grads_in_fp32``
    for bf16) and with fp32 training; the parameters' own dtype with fp16, whose default
    leaves it off (``megatron/model/distributed.py``: ``torch.float if
    accumulate_allreduce_grads_in_fp32 else param.dtype``; deepspeedai/Megatron-DeepSpeed
    @4efb479).

    >>> megatron_grad_bytes("bf16"), megatron_grad_bytes("fp16"), megatron_grad_bytes("fp32")
    (4, 2, 4)
    """
    return 2 if dtype == "fp16" else 4


def megatron_state_bytes(n_params: int, layout: Layout, dtype: str,
                         stack: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes of ``n_params`` under Megatron's own
    optimizer (module docstring): 2 + 4 + 12 per parameter in bf16 (fp16: 2 + 2 + 12,
    :func:`megatron_grad_bytes`), the 12 over ``dp`` with the distributed optimizer; fp32:
    4 + 4 + 8 (8 over ``dp``)."""
    w_b, g_b = dtype_bytes(dtype), megatron_grad_bytes(dtype)
    o_b = 8 if dtype == "fp32" else 12
    shard = layout.dp if stack == "megatron-distributed" else 1
    return n_params * w_b, n_params * g_b, int(n_params * o_b / shard)


def dp_reduce_bytes_per_param(dtype: str, stack: str) -> float | None:
    """What the data-parallel gradient reduction moves per parameter, as the bytes of an
    all-reduce of the same volume; ``None`` under DeepSpeed's engine, which reduces in the
    model's dtype (its gradient accumulation dtype defaults to the model's,
    ``get_data_types`` in ``deepspeed/runtime/engine.py``, DeepSpeed 0.19.8, and autotune's
    configs set no other).

    * ``megatron``: ``all_reduce`` of the whole gradient buffer
      (``DistributedDataParallel.allreduce_gradients``, ``megatron/model/distributed.py``):
      :func:`megatron_grad_bytes`, 4 in bf16, twice DeepSpeed's 2.
    * ``megatron-distributed``: a reduce-scatter of the gradient buffer and an all-gather
      of the updated weights into a buffer of the parameters' dtype
      (``reduce_model_grads`` and ``gather_model_params``, ``megatron/optimizer/
      distrib_optimizer.py``, same commit): each half an all-reduce's volume, so
      ``(grad + weight bytes) / 2``, 3 in bf16.

    >>> dp_reduce_bytes_per_param("bf16", "megatron"), dp_reduce_bytes_per_param("bf16",
    ...     "megatron-distributed"), dp_reduce_bytes_per_param("bf16", "deepspeed")
    (4, 3.0, None)
    """
    if stack == "megatron":
        return megatron_grad_bytes(dtype)
    if stack == "megatron-distributed":
        return (megatron_grad_bytes(dtype) + dtype_bytes(dtype)) / 2
    return None


def has_torch_adam_temp(stack: str) -> bool:
    """Whether the optimizer step allocates torch multi-tensor AdamW's ``sqrt(v)`` per
    updated parameter (the ``deepspeed`` stack: the built-in trainer's optimizer)."""
    return stack == "deepspeed"


def has_deepspeed_buckets(stack: str) -> bool:
    """Whether DeepSpeed's gradient buckets exist (its engine runs the reduction)."""
    return not is_megatron(stack)


_DS_DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
                   "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
                   "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16"}
"""DeepSpeed's names of a ``data_types.grad_accum_dtype`` (``DtypeEnum`` in
``deepspeed/runtime/config.py``, DeepSpeed 0.19.8), as the memory model names dtypes."""


def known_grad_accum_dtype(workload_kind: str, dtype: str, ds_config: dict[str, Any], *,
                           replay: bool = False) -> str | None:
    """The gradient accumulation dtype DeepSpeed's engine runs a study's trials with, where
    autotune writes their DeepSpeed config; ``None`` where it is not known.

    DeepSpeed takes ``data_types.grad_accum_dtype`` from the config, else the model's dtype
    (``get_data_types``, ``deepspeed/runtime/engine.py``, DeepSpeed 0.19.8). The built-in
    trainer's config is :func:`autotune.dsconfig.deepspeed_config` alone (no
    ``data_types``, and a study refuses ``workload.ds_config`` for it); a
    ``megatron-deepspeed`` trial's adds ``workload.ds_config``
    (``autotune.workloads.foreign``), which may set it. A ``command`` program may ignore
    the config autotune writes, and a replayed table ran its own recipe: unknown.

    >>> known_grad_accum_dtype("builtin", "bf16", {}), known_grad_accum_dtype(
    ...     "megatron-deepspeed", "bf16", {"data_types": {"grad_accum_dtype": "fp32"}})
    ('bf16', 'fp32')
    >>> known_grad_accum_dtype("command", "bf16", {}) is None
    True
    """
    if replay or workload_kind not in ("builtin", "megatron-deepspeed"):
        return None
    types = ds_config.get("data_types")
    named = types.get("grad_accum_dtype") if isinstance(types, dict) else None
    if named is None:
        return dtype
    return _DS_DTYPE_NAMES.get(str(named).lower())


def deepspeed_grad_bytes(layout: Layout, grad_accum_dtype: str | None,
                         dtype: str = "bf16") -> float:
    """Gradient bytes per parameter below ZeRO-2 in bf16 or fp16 under DeepSpeed's engine,
    by the optimizer wrapper its ``_do_optimizer_sanity_check`` picks (``deepspeed/runtime/
    engine.py``, DeepSpeed 0.19.8):

    * gradients accumulated in fp32 (``grad_accum_dtype`` fp32, or not known: the
      conservative recipe, :func:`autotune.models.memory_uncertainty.
      grad_accumulation_sigma_bytes` carries the other): ``BF16_Optimizer``'s fp32
      buffer beside the bf16 ``.grad``, 6;
    * in bf16, ZeRO-1: ``DeepSpeedZeroOptimizer``, the ``.grad`` and the flat copy of the
      rank's partition, ``2 + 2/dp``; ZeRO-0 with a pipeline: ``BF16_Optimizer`` with a
      bf16 buffer, ``2 + 2``; without one: ``FP16_Optimizer`` on bf16 (``DDP_BFLOAT16``),
      the ``.grad``, 2 (its step: :func:`deepspeed_step_excess_bytes`).

    >>> from autotune.layout import Layout
    >>> z1 = Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=1, zero_stage=1)
    >>> deepspeed_grad_bytes(z1, None), deepspeed_grad_bytes(z1, "bf16")
    (6, 2.5)

    fp16 has one recipe: without ZeRO the engine takes fp16 gradients only in fp16 (another
    ``grad_accum_dtype`` raises ``NotImplementedError``) and wraps the optimizer in
    ``FP16_Optimizer`` with or without a pipeline (``FP16``), the ``.grad``, 2; ZeRO-1 is
    ``DeepSpeedZeroOptimizer`` as above, ``2 + 2/dp``.

    >>> deepspeed_grad_bytes(z1, None, "fp16"), deepspeed_grad_bytes(
    ...     Layout(tp=1, pp=2, dp=2, micro_batch=1, grad_accum=2), None, "fp16")
    (2.5, 2)
    """
    if dtype == "fp16":
        return 2 + 2 / layout.dp if layout.zero_stage == 1 else 2
    if grad_accum_dtype != "bf16":
        return 6
    if layout.zero_stage == 1:
        return 2 + 2 / layout.dp
    return 4 if layout.pp > 1 else 2


def deepspeed_step_excess_bytes(layout: Layout, dtype: str,
                                grad_accum_dtype: str | None) -> int:
    """Bytes per parameter the optimizer step of ZeRO-0 holds beyond the 16-bit ``.grad``,
    where the wrapper is known to be ``FP16_Optimizer`` (:func:`deepspeed_grad_bytes`):
    bf16 without a pipeline with gradients accumulated in bf16 (``DDP_BFLOAT16``), and
    fp16 always (``FP16``). Its step casts every gradient of a group to fp32 and
    flattens them (``_flatten_dense_tensors([p.grad.to(fp32) ...])``,
    ``deepspeed/runtime/fp16/fused_optimizer.py``, DeepSpeed 0.19.8), 4 + 4 bytes before
    the 16-bit gradients are released; its unfused twin (``unfused_optimizer.py``, for
    torch's AdamW) keeps an fp32 ``.grad`` per parameter (4) while torch's multi-tensor
    AdamW takes ``sqrt(v)`` (4). The backward's activations are gone by then: the step's
    peak is the larger of the two phases (:func:`autotune.models.memory.estimate_memory`).
    0 elsewhere.
    """
    if layout.zero_stage == 0 and (dtype == "fp16" or (
            dtype == "bf16" and grad_accum_dtype == "bf16" and layout.pp == 1)):
        return 8
    return 0


def megatron_step_excess_bytes(layout: Layout, dtype: str, stack: str) -> float:
    """Bytes per parameter Megatron's fp16 optimizer step holds beyond its states: the
    fp32 copy of each gradient it hands Adam, ``main_param.grad =
    model_param.main_grad.float()`` (``_copy_model_grads_to_main_grads``,
    ``megatron/optimizer/optimizer.py``; with ``--use-distributed-optimizer`` of the rank's
    ``1/dp`` shard, ``shard_model_grad.float()`` in ``distrib_optimizer.py``;
    deepspeedai/Megatron-DeepSpeed@4efb479), while the fp16 ``main_grad`` buffer stays
    (contiguous buffers persist): 4, or ``4/dp``. In bf16 and fp32 the buffer is already
    fp32 (:func:`megatron_grad_bytes`) and ``.float()`` returns it: 0. Held until the next
    step's ``zero_grad``, after the backward: the larger phase counts, as for DeepSpeed's.

    >>> from autotune.layout import Layout
    >>> lay = Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=1)
    >>> [megatron_step_excess_bytes(lay, d, s) for d, s in (("fp16", "megatron"),
    ...     ("fp16", "megatron-distributed"), ("bf16", "megatron"))]
    [4, 1.0, 0]
    """
    if dtype != "fp16":
        return 0
    return 4 / layout.dp if stack == "megatron-distributed" else 4


def step_excess_bytes(layout: Layout, dtype: str, stack: str,
                      grad_accum_dtype: str | None) -> float:
    """Bytes per parameter the optimizer step of ``stack`` holds beyond the model states
    after the backward has released the activations (:func:`megatron_step_excess_bytes`,
    :func:`deepspeed_step_excess_bytes`)."""
    if is_megatron(stack):
        return megatron_step_excess_bytes(layout, dtype, stack)
    return deepspeed_step_excess_bytes(layout, dtype, grad_accum_dtype)
