"""How far an LLM-training cost model's step time is from the measured one, as published.

One figure owns the width of every throughput prior in the tool: the default strategy's
residual intercept (:mod:`autotune.search._residual`), hence the 90% band ``plan`` prints
(:mod:`autotune.planning.band`), and the conjugate throughput correction learned across
studies (:mod:`autotune.models.calibration`). It states how well a model of this kind
knows the overall level of a training run before any trial, taken from the validations
that the published models report against measured runs, never from a table this project
is judged on.

Published validations of step-time models of GPT training (mean absolute percentage
error of the predicted iteration time against the measured one, unless stated):

=============================================  ==============================  ========
model                                          runs                            error
=============================================  ==============================  ========
vTrain, Bang et al. 2024 (arXiv:2312.12391)    8 x A100, one node              8.37%
vTrain, same                                   up to 512 A100, multi-node      14.73%
AMPeD, Moolchandani et al. 2023 (ISPASS)       own runs and published ones     max 12%
Zhang et al. 2025 (arXiv:2509.22832)           128 A100 (Perlmutter)           4.98%
Zhang et al. 2025, same                        128 GH200 (Vista)               9.38%
=============================================  ==============================  ========

vTrain and Zhang et al. time the operators on the machine they predict (profiling and
sampled per-operator models); this project's analytic model takes published kernel rates
instead, so the largest figure is the one taken: vTrain's multi-node 14.73%. For a
normal log error of sd ``s`` the mean absolute error is ``s sqrt(2/pi)`` (small errors:
the relative error is the log error), so ``s = 0.1473 sqrt(pi/2)``. That is the spread
of a whole prediction; the strategy splits it into the shared scale (this intercept) and
its per-layout term (``LAYOUT_SD``), which it keeps as before, so the prior total is
wider than the published one, not narrower.

What it does not hold: a device no published validation covers. Every figure above is
an NVIDIA A100 or Hopper (GH200: the H100's GPU) system; on another device nothing bounds
how far the kernel rates the model takes are from what the device's software stack reaches,
and on the Intel Max 1550 that distance is large and moving: ALCF's AuroraGPT notes
(argonne-lcf/Megatron-DeepSpeed ``ALCF/notes/AuroraGPT-70B.md``) record one layout at
10.3 TFLOPS per tile under PyTorch 2.5 and 54.7 under 2.8, and LRZ's 175B runs reached
about 10% of the tile's BF16 peak. So a study on a device outside
:data:`VALIDATED_DEVICES` starts from the widest overall scale the residual model takes
(:func:`scale_sd`: ``WIDEST_SCALE`` times the published one, sd 1.48 of the log); its
first trials pin the level, and the band narrows with them. On a validated device the
strategy still widens the scale by the trials' evidence (``INTERCEPT_SCALES`` in
:mod:`autotune.search._residual`), so an offset moves every layout by one factor instead
of reordering them.
"""

from __future__ import annotations

import math

__all__ = ["PUBLISHED_MULTINODE_MAPE", "SCALE_SD", "VALIDATED_DEVICES", "WIDEST_SCALE",
           "scale_sd"]

PUBLISHED_MULTINODE_MAPE = 0.1473
"""vTrain's mean absolute percentage error of the iteration time over its multi-node
validation (up to 512 A100 GPUs; Bang et al. 2024, arXiv:2312.12391; MICRO 2024): the
largest of the published figures above."""

SCALE_SD = PUBLISHED_MULTINODE_MAPE * math.sqrt(math.pi / 2.0)
"""Prior sd of ``log(measured / predicted)`` shared by every layout of a study (0.185):
the published mean absolute error as the sd of a normal error."""

WIDEST_SCALE = 8.0
"""The widest overall scale the residual model takes, as a multiple of :data:`SCALE_SD`
(sd 1.48 of the log: a 90% band of a factor 11 either way on the scale alone): a model off
by a factor of several on a device its kernel rates do not describe."""

VALIDATED_DEVICES: dict[str, str] = {
    "a100-40gb": "vTrain (8 and up to 512 A100), Zhang et al. 2025 (128 A100)",
    "a100-80gb": "vTrain (8 and up to 512 A100), Zhang et al. 2025 (128 A100)",
    "h100": "Zhang et al. 2025 (128 GH200, whose GPU is the H100)",
    "h200": "Zhang et al. 2025 (128 GH200: Hopper with HBM3e, as the H200)",
}
"""Hardware-table devices (:data:`autotune.hardware.HARDWARE`) that a published validation
of a step-time model covers (the table above), with the validations."""


def scale_sd(device: str) -> float:
    """Prior sd of ``log(measured / predicted)`` shared by every layout of a study on
    ``device`` (a hardware-table name): :data:`SCALE_SD` where a published validation
    covers the device, else ``WIDEST_SCALE`` times it (module docstring).

    >>> round(scale_sd("a100-80gb"), 3), round(scale_sd("max1550-tile"), 3)
    (0.185, 1.477)
    """
    return SCALE_SD if device in VALIDATED_DEVICES else SCALE_SD * WIDEST_SCALE
