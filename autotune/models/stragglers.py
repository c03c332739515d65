"""A synchronous training step runs at the pace of its slowest device.

Devices of one kind in one cluster do not run at one speed: manufacturing variability and
each chip's power management make some GPUs of the same SKU slower than others, and a
slow device is slow in every step (Sinha et al., "Not All GPUs Are Created Equal", SC22,
arXiv:2208.11035v3; the spread per device kind is ``DeviceSpec.speed_sd``,
:data:`autotune.hardware.GPU_SPEED_SD`). Every step of data-, tensor- and
pipeline-parallel training synchronises all its ranks (the TP all-reduces inside a
replica, the pipeline's slowest stage, the data-parallel reduction across replicas), so the
step waits for the slowest of its ``N`` devices. With per-device speeds normal around the
median with sd ``sigma`` (a fraction of it), the device work of the step takes

    ``1 + sigma * E[max of N standard normals]``

times its median-device time: 1.42 sigma at 8 devices, 2.59 at 128, 3.25 at 1,024 (the
expected maximum of ``N`` independent standard normals, an order statistic, tabulated
since Tippett 1925: 3.24 at 1,000; David and Nagaraja, *Order Statistics*, 3rd ed. 2003).
This is the term that makes a weak-scaling curve fall with the node count where the
per-device work stays the same (docs/scaling.md); it does not move the ranking of a
study's layouts, which share one world size, except through the share of each step that
is device work. Only the device's kernels are slowed (the layers, the output layer, the
optimizer step): a link is as fast next to a slow device as next to a fast one.
"""

from __future__ import annotations

import functools
import math

__all__ = ["expected_max_standard_normal", "straggler_factor"]

_STEPS = 4000
"""Trapezoid intervals of the integral (accurate to ~1e-6 at every N here)."""


@functools.lru_cache(maxsize=64)
def expected_max_standard_normal(n: int) -> float:
    """``E[max(Z_1..Z_n)]`` for ``n`` independent standard normals (0 for ``n = 1``).

    ``E[M] = a + int_a^inf (1 - Phi(x)^n) dx`` (the expectation of a variable from its
    distribution function, here with ``M >= a``), integrated from ``a = -8`` to 9 by the
    trapezoid rule on a smooth integrand; outside that range the neglected probability is
    below 1e-14 for every ``n`` up to 10^6.

    >>> [round(expected_max_standard_normal(n), 4) for n in (1, 2, 8, 128, 1024)]
    [0.0, 0.5642, 1.4236, 2.5946, 3.2482]
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if n == 1:
        return 0.0
    lo, hi = -8.0, 9.0
    dx = (hi - lo) / _STEPS
    total = 0.0
    for i in range(_STEPS + 1):
        tail = 1.0 - (0.5 * math.erfc(-(lo + i * dx) / math.sqrt(2.0))) ** n
        total += tail * (0.5 if i in (0, _STEPS) else 1.0)
    return lo + total * dx


def straggler_factor(devices: int, speed_sd: float) -> float:
    """How much longer the device work of a step synchronised over ``devices`` takes than
    on the median device: ``1 + speed_sd * E[max of devices standard normals]`` (module
    docstring); 1 where the device kind has no published spread (``speed_sd`` 0).

    >>> round(straggler_factor(1024, 0.0148), 4), straggler_factor(1024, 0.0)
    (1.0481, 1.0)
    """
    if speed_sd <= 0.0 or devices <= 1:
        return 1.0
    return 1.0 + speed_sd * expected_max_standard_normal(devices)
