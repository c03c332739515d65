"""The DeepSpeed config of a layout: one function, used by the trainer and the exporter.

Pure (no DeepSpeed import) so that ``autotune best --emit deepspeed`` is instant. Keys as
in DeepSpeed's config reference: https://www.deepspeed.ai/docs/config-json/.

>>> from autotune.layout import Layout
>>> cfg = deepspeed_config(Layout(tp=2, pp=2, dp=2, micro_batch=1, grad_accum=8,
...                                zero_stage=1), "bf16")
>>> cfg["train_batch_size"], cfg["zero_optimization"]["stage"], cfg["bf16"]["enabled"]
(16, 1, True)
"""

from __future__ import annotations

from typing import Any

from autotune.layout import Layout

__all__ = ["deepspeed_config", "LEARNING_RATE"]

LEARNING_RATE = 1e-3
"""Trials measure speed, not convergence: any stable learning rate will do."""


def deepspeed_config(layout: Layout, dtype: str, *, lr: float = LEARNING_RATE) -> dict[str, Any]:
    """DeepSpeed JSON config for ``layout``.

    ``train_batch_size`` is the global batch (DeepSpeed checks it equals micro-batch x
    accumulation x data-parallel size). ``torch_adam`` selects ``torch.optim.AdamW``:
    DeepSpeed's FusedAdam JIT-compiles for minutes on CPU and needs Intel's compiler on XPU.
    """
    return {
        "train_batch_size": layout.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "optimizer": {"type": "AdamW", "params": {
            "lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
            "torch_adam": True}},
        "zero_optimization": {"stage": layout.zero_stage},
        "bf16": {"enabled": dtype == "bf16"},
        "gradient_clipping": 0.0,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
