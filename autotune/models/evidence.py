"""Gaussian corrections across studies and how far the trials support them: a linear
correction's carry-over to a new study (:func:`carry_over_gaussian`), its evidence
(:func:`gaussian_log_evidence`) and the width of its shape terms the trials support
(:func:`evidence_scale`). Used by :mod:`autotune.models.calibration` and the residual
search (:mod:`autotune.search._residual`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["STUDY_CORRELATION", "SHAPE_SCALES", "carry_over_gaussian", "evidence_scale",
           "gaussian_log_evidence"]

STUDY_CORRELATION = 0.9
"""``rho``: how much of a correction carries over from earlier studies of one key to a new
one. Studies of one device type, dtype and workload share the hardware and the software
stack; what differs is the model, the world size and the space. 0.9 keeps 19% of the
fresh prior's variance (44% of its sd) however well the earlier studies knew the
correction: their knowledge is trusted to about half the width of the model's own
ignorance. A generic statement, not fitted to any table."""


def carry_over_gaussian(mean: np.ndarray, cov: np.ndarray, fresh_cov: np.ndarray, *,
                        rho: float = STUDY_CORRELATION) -> tuple[np.ndarray, np.ndarray]:
    """:func:`autotune.models.calibration.carry_over` for a vector of coefficients (the
    default strategy's residual model): prior mean ``rho · mean``, covariance
    ``rho^2 · cov + (1 - rho^2) · fresh_cov``."""
    return rho * mean, rho**2 * cov + (1.0 - rho**2) * fresh_cov


SHAPE_SCALES: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
"""The widths, as fractions of the generic prior's, among which :func:`evidence_scale`
chooses for the terms of a residual model that change the ranking (0: none, the cost
model's ranking kept; 1: the full prior)."""


def evidence_scale(x: np.ndarray, r: np.ndarray, prior_mean: np.ndarray,
                   prior_cov: np.ndarray, shape: np.ndarray, noise_sd: float,
                   scales: Sequence[float] = SHAPE_SCALES) -> float:
    """The width of the *shape* terms of a linear residual model ``r = x·w + e`` that the
    measurements support: the scale ``a`` of ``scales`` of largest marginal likelihood
    (type-II maximum likelihood, the evidence approximation: MacKay 1992, "Bayesian
    Interpolation"; Bishop 2006, section 3.5). Under scale ``a`` the prior of ``w`` is
    ``N(D·m, D·S·D)``, ``D = diag(a where shape else 1)``, so the evidence is

        r ~ N(x·D·m, x·D·S·D·x' + noise_sd^2 · I).

    ``shape`` marks the coefficients that can reorder layouts (a calibration slope, a
    trend per axis, a value of a categorical axis); the others (an overall scale) always
    keep their prior. Why: fitted on 2 or 4 trials at full width, the shape terms read the
    unexplained scatter between the trials as a trend of an axis and carry it to every
    untried layout, which ranks them worse than the cost model where it is right
    (``benchmarks/cost_model_accuracy.py``, online row). The evidence keeps them off until
    the trials disagree with the model's shape by more than that scatter; ties go to the
    smaller scale (Occam). With no measurement the full prior (1.0) is kept."""
    if len(r) == 0:
        return 1.0
    best, best_log_ml = 1.0, -math.inf
    for a in sorted(scales):
        d = np.where(shape, a, 1.0)
        log_ml = gaussian_log_evidence(x, r, d * prior_mean,
                                       d[:, None] * prior_cov * d[None, :], noise_sd)
        if log_ml is not None and log_ml > best_log_ml + 1e-9:
            best, best_log_ml = a, log_ml
    return best


def gaussian_log_evidence(x: np.ndarray, r: np.ndarray, mean: np.ndarray, cov: np.ndarray,
                          noise_sd: float) -> float | None:
    """``log N(r; x·mean, x·cov·x' + noise_sd^2 · I)``: the marginal likelihood of a linear
    Gaussian model (Bishop 2006, eq. 3.86), ``None`` where the covariance is not positive.

    In the coefficients' space (``p`` of them) instead of the measurements' (``n``): with
    ``s = noise_sd^2`` and ``M = I_p + x'x·cov / s``, the determinant lemma (Sylvester)
    gives ``log det = n·log s + log det M`` and the push-through form of the Woodbury
    identity ``C^-1 = (I - x·cov·M^-1·x' / s) / s``, both valid for a singular ``cov`` (a
    shape width of 0). A study's ``n`` grows to hundreds while ``p`` stays a few dozen: the
    direct ``n x n`` factorisations would cost most of a worker's CPU.

    >>> rng = np.random.default_rng(0)
    >>> x, r = rng.normal(size=(30, 3)), rng.normal(size=30)
    >>> m, S = np.zeros(3), np.diag([1.0, 0.0, 0.5])
    >>> C = x @ S @ x.T + 0.04 * np.eye(30)
    >>> direct = -0.5 * (r @ np.linalg.solve(C, r) + np.linalg.slogdet(C)[1]
    ...                  + 30 * math.log(2 * math.pi))
    >>> bool(abs(gaussian_log_evidence(x, r, m, S, 0.2) - direct) < 1e-8)
    True
    """
    n, noise = len(r), noise_sd**2
    resid = r - x @ mean
    g, gram = x.T @ resid, x.T @ x
    m = np.eye(len(mean)) + gram @ cov / noise
    sign, logdet_m = np.linalg.slogdet(m)
    if sign <= 0:
        return None
    quad = (resid @ resid - (g @ cov) @ np.linalg.solve(m, g) / noise) / noise
    return -0.5 * (quad + n * math.log(noise) + logdet_m + n * math.log(2.0 * math.pi))
