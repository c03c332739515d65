"""Workloads: the training program a study's trials run (the study file's ``workload``).

====================  ==========================================================================
module                owns
====================  ==========================================================================
``base.py``           the contract (:class:`~autotune.workloads.base.Workload`: prepare, argv, env,
                      watch, finish), :class:`~autotune.workloads.base.Placement`, the built-in
                      trainer, the no-progress watch
``foreign.py``        the user's own program: ``command`` (an argv template) and
                      ``megatron-deepspeed`` (a script plus the flags autotune owns)
``megatron.py``       Megatron-DeepSpeed's flags autotune owns: one source for trials and export
``readback.py``       reading a foreign trial's steps back (metrics file, log adapters) and its
                      score
``rank_env.py``       ``python -m autotune.workloads.rank_env -- CMD``: torchrun's rank variables
                      for a program started by srun
====================  ==========================================================================

Nothing heavy is imported here: :mod:`autotune.workloads.rank_env` runs on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.config.cluster import ClusterConfig
    from autotune.config.workload import WorkloadConfig
    from autotune.workloads.base import Workload

__all__ = ["make_workload"]


def make_workload(config: WorkloadConfig | None, cluster: ClusterConfig) -> Workload:
    """The workload a study's ``workload`` section asks for (``None``: the built-in
    trainer); ``cluster`` gives a foreign trial's device peak for its MFU."""
    from autotune.workloads.base import BuiltinWorkload

    if config is None or not config.foreign:
        return BuiltinWorkload()
    from autotune.workloads.foreign import CommandWorkload, MegatronWorkload

    cls = CommandWorkload if config.kind == "command" else MegatronWorkload
    return cls(config, cluster)
