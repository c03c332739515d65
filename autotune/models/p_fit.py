"""The probability that a layout fits, from its predicted peak and error bar.

Split from :mod:`autotune.models.memory_uncertainty` (the per-term error bars and the
verdict), which re-exports these: the log-normal ``P(peak <= usable)`` of a (corrected)
prediction, and the probability of fitting conditioned on a measured OOM of a sibling
layout that needed no more memory, or on a sibling that ran. The derivations are in that
module's docstring.
"""

from __future__ import annotations

import math

__all__ = ["log_sigma", "fit_probability", "oom_conditioned_p_fit", "run_conditioned_p_fit"]


def log_sigma(relative_sigma: float, correction_sigma: float = 0.0) -> float:
    """sd of ``ln(peak)``: the log-normal with coefficient of variation ``relative_sigma``
    (``sqrt(ln(1 + cv^2))``), with a correction's log-sd added in quadrature."""
    return math.sqrt(math.log1p(relative_sigma ** 2) + correction_sigma ** 2)


def fit_probability(peak_bytes: float, usable_bytes: float, relative_sigma: float, *,
                    correction: float = 1.0, correction_sigma: float = 0.0) -> float:
    """``P(true peak <= usable_bytes)`` with ``ln(peak) ~ N(ln(correction * peak_bytes),
    s^2)``, ``s`` = :func:`log_sigma` (module docstring). A zero spread gives 0 or 1."""
    if usable_bytes <= 0:
        return 0.0
    median = correction * peak_bytes
    if median <= 0:
        return 1.0
    s = log_sigma(relative_sigma, correction_sigma)
    z = math.log(usable_bytes / median)
    if s == 0.0:
        return 1.0 if z >= 0 else 0.0
    return 0.5 * math.erfc(-z / (s * math.sqrt(2.0)))


def oom_conditioned_p_fit(headroom_sd: float, oom_headroom_sd: float) -> float:
    """P(fit) of a layout after a sibling ran out of memory, from both layouts' headroom in
    sds (:attr:`~autotune.models.memory_uncertainty.MemoryVerdict.headroom_sd`,
    ``z = ln(usable / median) / s``; P(fit) = ``Phi(z)``).

    Siblings (same tp and pp: the same model shard and recipe) share the model's error:
    taken as one standardised error ``e`` for both, a layout fits when ``e <= z``. The OOM
    says ``e > z_oom``, so ``P(fit | OOM) = P(z_oom < e <= z) / P(e > z_oom) = 1 -
    Q(z) / Q(z_oom)`` with ``Q`` the upper tail: a sibling that needs at least as much
    (``z <= z_oom``) cannot fit (the rule of :func:`autotune.search.dominated_by_oom`), one
    with much more headroom barely moves. Computed with upper tails, so that two layouts
    the model is sure of (``P(fit)`` 1 in floating point) still compare.

    >>> round(oom_conditioned_p_fit(3.0902, 2.3263), 3), oom_conditioned_p_fit(1.0, 2.0)
    (0.9, 0.0)
    """
    if not headroom_sd > oom_headroom_sd:
        return 0.0
    if math.isinf(headroom_sd):
        return 1.0
    q, q_oom = _upper_tail(headroom_sd), _upper_tail(oom_headroom_sd)
    if q_oom > 0.0:
        return 1.0 - q / q_oom
    # Both beyond ~38 sd: the tails' ratio from their asymptote phi(z) / z (Mills ratio).
    return 1.0 - math.exp(-(headroom_sd ** 2 - oom_headroom_sd ** 2) / 2) * (
        oom_headroom_sd / headroom_sd)


def run_conditioned_p_fit(headroom_sd: float, ran_headroom_sd: float,
                          oom_headroom_sd: float | None = None) -> float:
    """P(fit) of a layout after a sibling ran (and, with ``oom_headroom_sd``, another ran
    out of memory), from the layouts' headroom in sds, as :func:`oom_conditioned_p_fit`.

    The same shared error ``e``: the sibling that ran says ``e <= z_ran``, an OOM says
    ``e > z_oom``, so ``P(fit) = P(e <= z | z_oom < e <= z_ran) = (Q(z_oom) - Q(z)) /
    (Q(z_oom) - Q(z_ran))`` (``Q`` the upper tail, ``Q(z_oom) = 1`` without an OOM): a
    layout with at least the headroom of one that ran fits, one with less is as likely to
    fit as the error is to lie below its headroom within what the two trials left open.
    Where the trials contradict the model's order (the run with less headroom than the
    OOM), they say nothing about the shared error: the OOM's condition alone.

    >>> run_conditioned_p_fit(1.0, 0.5), round(run_conditioned_p_fit(0.0, 1.0), 3)
    (1.0, 0.594)
    >>> round(run_conditioned_p_fit(0.5, 1.0, 0.0), 3)
    0.561
    """
    if oom_headroom_sd is not None and not ran_headroom_sd > oom_headroom_sd:
        return oom_conditioned_p_fit(headroom_sd, oom_headroom_sd)
    if headroom_sd >= ran_headroom_sd:
        return 1.0
    if oom_headroom_sd is not None and not headroom_sd > oom_headroom_sd:
        return 0.0
    q_low = 1.0 if oom_headroom_sd is None else _upper_tail(oom_headroom_sd)
    width = q_low - _upper_tail(ran_headroom_sd)
    if width <= 0.0:  # both bounds beyond floating point's tails: nothing to tell apart
        return 1.0
    return min(1.0, max(0.0, (q_low - _upper_tail(headroom_sd)) / width))


def _upper_tail(z: float) -> float:
    """``Q(z) = P(e > z)`` of a standard normal, accurate far into the tail (erfc)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))
