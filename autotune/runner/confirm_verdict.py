"""The confirmation round's verdict from its stored runs, and the skip by measured noise.

Owns turning stored confirmation runs into :func:`autotune.trial.paired.paired_decision`'s
inputs (complete rounds, the noise known beforehand: :func:`round_noise`), and the
one-line skip when the study's launch-to-launch noise cannot turn a rival ahead of the
best (:func:`noise_cannot_flip`). Pure but for the one read of the study's measurements.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

from autotune.runner.confirm_budget import LaunchNoise, launch_noise
from autotune.storage import Storage
from autotune.trial.paired import (
    CONFIDENCE,
    ConfirmCandidate,
    Noise,
    PairedDecision,
    decision_line,
    paired_decision,
)

__all__ = ["decide", "favoured", "round_noise", "noise_cannot_flip", "RUN_NOISE_DF",
           "confirmation_record", "shown", "basis_of"]

RUN_NOISE_DF = 8
"""Degrees of freedom granted to the noise a run's own precision states: it comes from
its timed steps (``trial.measure_steps`` at least, more until the precision is reached)."""
_Z95 = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)


def round_noise(precisions: list[list[float | None]], *, same_launch: bool,
                launch_var: float | None, launch_df: int) -> Noise:
    """What is known of the rounds' noise beforehand (:class:`~autotune.trial.paired.
    Noise`): the runs' own precision (``precisions``: each round's pair of runs; the
    median over rounds) and,
    when each run is its own launch, twice the study's launch-to-launch variance where
    that is larger."""
    per_round = sorted(sum(((p or 0.0) / _Z95) ** 2 for p in ps[:2]) for ps in precisions)
    run_var = per_round[len(per_round) // 2] if per_round else 0.0
    if same_launch:
        return Noise(run_var, run_var, RUN_NOISE_DF if run_var > 0 else 0)
    if launch_var is not None and launch_df > 0:
        # A repeat of a layout in a new launch varies by all its noise, its run's own
        # included: the launch variance is the whole of it, never added to the run's.
        return Noise(run_var, max(run_var, 2 * launch_var), launch_df)
    return Noise(run_var, 0.0, 0)


def decide(runs: list[dict[str, Any]], keys: list[str], max_rounds: int, *, margin: float,
           same_launch: bool, launch: LaunchNoise | None) -> PairedDecision | None:
    """The verdict of the complete rounds among ``runs`` (``None``: none is complete). A
    run stored ``stopped`` by an earlier version (which stopped them early) is dropped
    with its round."""
    rounds, precision, whole = _complete_rounds(runs, keys)
    if not whole:
        return None
    first = paired_decision([rounds[n] for n in whole], max_rounds=max_rounds)
    pair = [first.winner, first.runner_up or first.winner]
    noise = round_noise([[precision[n].get(k) for k in pair] for n in whole],
                        same_launch=same_launch, launch_var=launch.var if launch else None,
                        launch_df=launch.df if launch else 0)
    return paired_decision([rounds[n] for n in whole], noise=noise,
                           max_rounds=max_rounds, margin=margin)


def favoured(runs: list[dict[str, Any]], keys: list[str], single_pass: str) -> str | None:
    """The candidate the paired rounds favour over the single pass's best: the one that
    beat it in a strict majority of the complete rounds and by the most on the geometric
    mean; ``None`` when none did (the single pass's best is then kept). Interleaved
    rounds see drift alike for every member, so their majority is less biased than the
    single pass's order, without being a verdict at any confidence."""
    rounds, _, numbers = _complete_rounds(runs, keys)
    whole = [rounds[n] for n in numbers]
    best: tuple[float, str] | None = None
    for key in keys:
        if key == single_pass or not whole:
            continue
        logs = [math.log(v[key] / v[single_pass]) for v in whole]
        if 2 * sum(x > 0 for x in logs) > len(logs) and sum(logs) > 0:
            if best is None or sum(logs) > best[0]:
                best = (sum(logs), key)
    return best[1] if best else None


def basis_of(cands: list[ConfirmCandidate]) -> str:
    """The round's key: its candidates' trial numbers (a new rival makes a new round)."""
    return ",".join(str(n) for n in sorted(c.trial_number for c in cands))


def confirmation_record(decision: PairedDecision | None, cands: list[ConfirmCandidate], *,
                        state: str, launches: int, device_s: float, complete_trials: int,
                        note: str | None = None,
                        favours: str | None = None) -> dict[str, Any]:
    """The study attribute: the verdict, the candidates, the cost, and the count of
    complete trials it holds for (a later trial makes it stale). Not distinguishable, the
    named best is the single pass's (``cands[0]``) unless the paired evidence favours
    another (``favours``: :func:`~autotune.runner.confirm_verdict.favoured`), and
    ``equivalent_to`` the other of the rounds' two first."""
    numbers = {c.key: c.trial_number for c in cands}
    base: dict[str, Any] = (decision.to_record() if decision is not None else
                            {"winner": cands[0].key, "runner_up": None, "ratio": None,
                             "interval": None, "rounds": 0, "distinguishable": None})
    if decision is not None and decision.runner_up is not None and \
            not decision.distinguishable and state == "decided":
        named = cands[0].key if favours is None or favours == cands[0].key else favours
        other = decision.runner_up if named == decision.winner else decision.winner
        base = {**base, "paired_winner": decision.winner, "winner": named,
                "equivalent_to": other}
    return {**base, "state": state, "note": note, "basis": basis_of(cands),
            "single_pass": cands[0].key,
            "winner_trial": numbers.get(base["winner"]),
            "runner_up_trial": numbers.get(base["runner_up"]) if base["runner_up"] else None,
            "candidates": [c.key for c in cands], "launches": launches,
            "device_s": round(device_s, 3), "complete_trials": complete_trials}


def shown(decision: PairedDecision | None, runs: list[dict[str, Any]],
           cands: list[ConfirmCandidate], complete: int) -> str:
    """The verdict so far, in the words of :func:`~autotune.trial.paired.decision_line`."""
    if decision is None:
        return "every round so far had a failed run"
    keys = [c.key for c in cands]
    return decision_line(confirmation_record(
        decision, cands, state="decided", launches=0, device_s=0.0, complete_trials=complete,
        favours=favoured(runs, keys, cands[0].key)))


def noise_cannot_flip(storage: Storage, study_name: str,
                      cands: list[ConfirmCandidate]) -> str | None:
    """Why the round is not needed, when the study's launch-to-launch noise cannot turn
    any rival ahead of the best, one-sided at the paired interval's level for each rival;
    else ``None``."""
    noise = launch_noise(storage, study_name)
    if noise is None or noise.df < 2:
        return None
    from scipy.stats import t  # lazily: only with a measured noise

    crit = float(t.ppf(1.0 - (1.0 - CONFIDENCE) / (2.0 * (len(cands) - 1)), noise.df))
    best = cands[0]
    # The repeats varied by everything that moves a layout's value between launches, its
    # runs' own noise included: that variance, twice (best and rival), is the spread.
    spread = math.sqrt(2 * noise.var)
    for rival in cands[1:]:
        if math.log(best.value / rival.value) <= crit * spread:
            return None
    return (f"the study's launch-to-launch noise (±{noise.pct:.1f}%, {noise.df} repeats) "
            f"cannot turn a rival ahead of the best {best.key}")


def _complete_rounds(runs: list[dict[str, Any]], keys: list[str]
                     ) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float | None]],
                                list[int]]:
    """Per round, each candidate's measured value and its run's precision, and the numbers
    of the rounds in which every candidate completed (a failed run drops its round)."""
    rounds: dict[int, dict[str, float]] = {}
    precision: dict[int, dict[str, float | None]] = {}
    failed: set[int] = set()
    for r in runs:
        value = r.get("model_tflops_per_device")
        if r.get("outcome") != "complete" or not value:
            failed.add(r["round"])
        else:
            rounds.setdefault(r["round"], {})[r["layout_key"]] = float(value)
            precision.setdefault(r["round"], {})[r["layout_key"]] = r.get("measure_precision")
    whole = [n for n, v in sorted(rounds.items()) if n not in failed and sorted(v) == sorted(keys)]
    return rounds, precision, whole
