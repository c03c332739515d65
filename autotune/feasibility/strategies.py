"""Feasibility rules of the ZeRO-3 variants (MiCS, hpZ) and DeepSpeed-Ulysses.

:func:`autotune.feasibility.check_layout` calls :func:`strategy_reasons`; this module owns
the rules that need the model, the layout's group sizes or the DeepSpeed the trials run
(the study file's own cross-field rules are :mod:`autotune.config._strategy_axes`):

* ``zero_shard``: the MiCS shard / hpZ partition must divide the group ZeRO-3 partitions
  over (``dp * ulysses``): DeepSpeed builds ``world / shard`` shard groups of consecutive
  ranks (``deepspeed/runtime/zero/mics_utils.py``, ``create_mics_comm_groups``, which
  asserts the divisibility; hpZ: ``zero/partition_parameters.py``,
  ``_create_zero_param_parallel_group``).
* ``ulysses_heads`` / ``ulysses_seq_len``: Ulysses' all-to-all turns a sequence shard of
  all heads into all positions of ``heads / ulysses`` heads (Jacobs et al. 2023, section
  3.1; ``deepspeed/sequence/layer.py``, ``single_all_to_all``), so the degree divides the
  heads of one TP rank (the key/value heads too) and the sequence length.
* ``ulysses_tp_pp``: Ulysses only with ``tp = pp = 1``: both Megatron-DeepSpeed forks
  assert it (``megatron/core/parallel_state.py``, ``initialize_model_parallel``: "DeepSpeed's
  sequence parallel does not work with tensor parallel or pipeline parallel"; deepspeedai
  4efb479 line 146, argonne-lcf ffa3456 line 146), and the built-in trainer follows them.
* ``mics_deepspeed``: DeepSpeed 0.19 removed MiCS (``zero_optimization.mics_shard_size``
  is refused), so a MiCS layout is feasible only where the trials' DeepSpeed is older.

>>> from autotune.config.model import MODEL_PRESETS
>>> from autotune.layout import Layout
>>> lay = Layout(tp=1, pp=1, dp=6, micro_batch=1, grad_accum=1, zero_stage=3,
...              zero_variant="mics", zero_shard=4)
>>> [code for code, _ in strategy_reasons(lay, MODEL_PRESETS["tiny"],
...                                   DeepSpeedRuntime("0.19.8", "the project environment"))]
['zero_shard', 'mics_deepspeed']
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from autotune.config.model import ModelConfig
from autotune.layout import Layout

__all__ = ["DeepSpeedRuntime", "strategy_reasons", "STRATEGY_REASON_CODES",
           "MICS_REMOVED_IN"]

MICS_REMOVED_IN = Version("0.19")
"""The first DeepSpeed without MiCS."""

STRATEGY_REASON_CODES: dict[str, str] = {
    "zero_shard": "the MiCS shard / hpZ partition size does not divide the ZeRO group",
    "ulysses_heads": "the Ulysses degree does not divide the attention heads per TP rank",
    "ulysses_seq_len": "the Ulysses degree does not divide the sequence length",
    "ulysses_tp_pp": "Ulysses with tensor or pipeline parallelism (Megatron-DeepSpeed refuses it)",
    "mics_deepspeed": "MiCS with a DeepSpeed that has none (removed in 0.19)",
}


@dataclass(frozen=True)
class DeepSpeedRuntime:
    """The DeepSpeed the trials run: its version (``None``: none importable) and where it
    was read (for the message)."""

    version: str | None
    source: str

    def has_mics(self) -> bool:
        """Whether this DeepSpeed still has MiCS (a version before 0.19)."""
        if self.version is None:
            return False
        try:
            return Version(self.version).release < MICS_REMOVED_IN.release
        except InvalidVersion:
            return False


def strategy_reasons(lay: Layout, model: ModelConfig,
                     deepspeed: DeepSpeedRuntime | None) -> list[tuple[str, str]]:
    """Every ``(code, message)`` of this module's rules why ``lay`` cannot run ``model``
    (the check makes them :class:`~autotune.feasibility.Reason`); ``deepspeed``: the
    trials' DeepSpeed (``None``: not checked, e.g. a replayed table)."""
    out: list[tuple[str, str]] = []
    if lay.zero_variant != "none" and lay.zero_group % lay.zero_shard:
        out.append(("zero_shard", f"zero_variant {lay.zero_variant} with shard size "
                          f"{lay.zero_shard}: it does not divide the ZeRO group dp*ulysses = "
                          f"{lay.dp}*{lay.ulysses} = {lay.zero_group}"))
    if lay.ulysses > 1 and (lay.tp > 1 or lay.pp > 1):
        out.append(("ulysses_tp_pp", f"ulysses={lay.ulysses} with tp={lay.tp}, pp={lay.pp}: "
                    "DeepSpeed-Ulysses runs only with tp = pp = 1 (Megatron-DeepSpeed's "
                    "initialize_model_parallel asserts it)"))
    if lay.ulysses > 1:
        heads = model.n_head // lay.tp if model.n_head % lay.tp == 0 else model.n_head
        kv = model.kv_heads // lay.tp if model.kv_heads % lay.tp == 0 else model.kv_heads
        if heads % lay.ulysses or kv % lay.ulysses:
            out.append(("ulysses_heads", f"ulysses={lay.ulysses} does not divide the "
                              f"heads per TP rank (n_head {model.n_head} / tp {lay.tp}, "
                              f"key/value heads {model.kv_heads} / tp {lay.tp})"))
        if model.seq_len % lay.ulysses:
            out.append(("ulysses_seq_len", f"ulysses={lay.ulysses} does not divide "
                              f"seq_len={model.seq_len}"))
    if lay.zero_variant == "mics" and deepspeed is not None and not deepspeed.has_mics():
        found = deepspeed.version or "none"
        out.append(("mics_deepspeed", f"MiCS needs DeepSpeed < {MICS_REMOVED_IN}; found "
                          f"{found} ({deepspeed.source})"))
    return out
