"""Pipeline parallelism: the GPT's layers as a DeepSpeed ``PipelineModule``.

DeepSpeed runs the 1F1B schedule (``TrainSchedule``; Narayanan et al. 2021, section 2.2)
over ``grad_accum`` micro-batches. Stages are balanced by transformer blocks
(``partition_method="type:Block"``): the embedding joins the first stage and the output
layer the last, as in Megatron. With ``recompute: full`` every block is checkpointed
(``activation_checkpoint_interval=1``) with PyTorch's non-reentrant checkpoint, the same
function :class:`trainer.model.GPT` uses without a pipeline, through
:meth:`trainer.dropout.DropoutRNG.checkpoint` so that a recomputed block draws the dropout
masks of its forward.
"""

from __future__ import annotations

from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from autotune.config.model import ModelConfig
from trainer.dropout import DropoutRNG
from trainer.model import Block, Embedding, Head, LossFn
from trainer.tp_context import TPContext

__all__ = ["build_pipeline_module"]


def build_pipeline_module(model: ModelConfig, topology: PipeModelDataParallelTopology,
                          tp: TPContext, *, seed: int, recompute: str) -> PipelineModule:
    """Build this rank's stage; binds ``tp.group`` to the module's tensor-parallel group.
    ``recompute`` as in :class:`trainer.model.GPT`."""
    selective = recompute == "selective"
    rng = DropoutRNG(model.dropout, seed)
    specs = ([LayerSpec(Embedding, model, tp, seed, rng)]
             + [LayerSpec(Block, model, tp, seed, i + 1, checkpoint_attention=selective,
                          rng=rng) for i in range(model.n_layer)]
             + [LayerSpec(Head, model, tp, seed)])
    module = PipelineModule(
        layers=specs, topology=topology, loss_fn=LossFn(model, tp),
        partition_method="type:Block",
        activation_checkpoint_interval=1 if recompute == "full" else 0,
        activation_checkpoint_func=rng.checkpoint,
        checkpointable_layers=["Block"],
    )
    # The layers only needed their TP rank to pick their shards; the group the
    # collectives run in exists only now (PipelineModule builds its grid first).
    tp.group = module.mpu().get_slice_parallel_group()
    return module
