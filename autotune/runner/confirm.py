"""The confirmation round: before a study names its best, re-measure its rivals side by side.

Run by :func:`autotune.runner.study.run_study` once the study is done (budget claimed, or
a search stop), with every trial recorded. The candidates are the best measured layout and
those whose interval overlaps its interval, ``search.confirm`` at most
(:func:`autotune.trial.paired.overlapping`). Each round measures every candidate once, in
alternating order (A B C, then C B A: a drift linear in time then favours no slot), with
the study's trial settings and never an early stop (``trial.early_stop_tolerance`` is the
search's: a confirmation run is measured to the end, so every round is usable). With the
built-in trainer and a launcher that batches, every round the budget affords runs in one
launch holding every candidate's engine, rotating among them and stopped once the verdict
settles (:mod:`autotune.runner.confirm_rotation`; start-up paid once); otherwise (a user's
program, the replay launcher) each run is its own launch, in the same interleaved order.
After each pair of rounds the verdict is taken (:func:`autotune.trial.paired.
paired_decision`, its error rate stated there) until it is distinguishable or equivalent,
or ``search.confirm_max_rounds``, the device budget (``search.confirm_budget`` of the
search's device-seconds) or the wall-time limit ends it (:mod:`.confirm_budget`). With
each run its own launch, the round plans the rounds the budget affords before its first
look (at most ``search.confirm_max_rounds``) and decides on the last of them. Out of
budget, the verdict is "not decided within the budget" and the single pass's best stands;
out of time, the round is left unfinished for the next run. A round whose rivals the
study's launch-to-launch noise cannot overtake is skipped in one line. Not
distinguishable, the single pass's best is kept unless the rounds favour another
(:func:`~autotune.runner.confirm_verdict.favoured`), and the two the rounds rank first are
named equivalent where the interval says so; the budget trims the farthest rivals first.

With several node groups in one run, the first group's launcher measures it. Of many
workers sharing a study, the one that finds every trial recorded (no live claim, no retry
waiting) claims the round (the study's lock and a lease, as a layout's claim); the others
end their run, saying who confirms. A runner killed inside it leaves its stored rounds and
a lease that runs out; the next run goes on from them. Ctrl-C releases the lease at once.
A runner whose round was taken over (silent for the grace period: an outage, a frozen node)
learns it at its next heartbeat or write: its launch is killed, nothing more is stored, and
the round is left to the worker that holds it now.

The verdict is stored on the study (:data:`~autotune.storage.keys.StudyAttr.
CONFIRMATION`) and each run in ``confirmation_runs``; no run is an Optuna trial, so none
counts against the budget and none is left RUNNING.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import run_defaults
from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.runner.confirm_budget import Allowance, launch_noise, search_cost
from autotune.runner.confirm_rotation import (
    first_step_fits,
    held_idle_s,
    planned_rounds,
    rotate_rounds,
    rotates,
)
from autotune.runner.confirm_runs import measure_rounds, record_step
from autotune.runner.confirm_verdict import (
    basis_of,
    confirmation_record,
    decide,
    favoured,
    noise_cannot_flip,
    shown,
)
from autotune.runner.lifecycle import StopSignals, heartbeat
from autotune.spec import StudySpec
from autotune.storage import (
    ConfirmClaimed,
    ConfirmRefused,
    Lease,
    Storage,
    StudyAttr,
    TrialAttr,
    claim_confirmation,
    claim_counts,
    confirmation_lease,
    decided_record,
    finish_confirmation,
    release_confirmation,
    repair_stale,
    set_user_attrs,
    stored_runs,
    trial_layout,
)
from autotune.trial.paired import (
    MIN_ROUNDS,
    ROUNDS_PER_STEP,
    ConfirmCandidate,
    cost_line,
    decision_line,
    overlapping,
    settled,
)

__all__ = ["confirm_best", "confirmation_record", "candidates_of", "DEFAULT_PRECISION",
           "ROUNDS_PER_STEP", "ConfirmResult"]

DEFAULT_PRECISION = run_defaults.PRECISION
"""The precision assumed of a trial without one when ``trial.measure_precision`` is off
(``trial.measure_precision``'s own default)."""


@dataclass
class ConfirmResult:
    record: dict[str, Any] | None
    """What was stored on the study (``None``: this worker did not confirm)."""
    line: str
    """What to tell the user."""
    ended: str | None = None
    """Why the round stopped unfinished: ``interrupt``, ``sigterm`` or ``timeout`` (the
    run's end: :class:`autotune.runner.worker.RunSummary`'s ``stopped_by``). ``None`` too
    when the round is another worker's (claimed by it, or its lease lost mid-round): this
    run then ends as its search did, and the round's holder names the best."""


def candidates_of(study: optuna.Study, spec: StudySpec) -> list[ConfirmCandidate]:
    """The candidates of the study's confirmation round, fastest first."""
    measured = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        lay = trial_layout(t)
        # "stopped" trials were cut short as hopeless: measured, but never the best.
        if lay is None or t.value is None or t.user_attrs.get(TrialAttr.OUTCOME) != "complete":
            continue
        prec = t.user_attrs.get(TrialAttr.MEASURE_PRECISION)
        measured.append(ConfirmCandidate(lay.key(), t.number, float(t.value),
                                         float(prec) if prec is not None else None))
    return overlapping(measured, spec.search.confirm, assumed_precision=_assumed(spec))


def _assumed(spec: StudySpec) -> float:
    assumed = spec.trial.measure_precision
    return assumed if assumed is not None else DEFAULT_PRECISION


def confirm_best(spec: StudySpec, storage: Storage, study: optuna.Study, launcher: Launcher,
                 *, worker: str, signals: StopSignals | None = None,
                 say: Callable[[str], None] = lambda _: None,
                 deadline: float | None = None) -> ConfirmResult:
    """Run (or resume, or leave to another worker) the study's confirmation round;
    ``deadline``: the run's wall-time limit, on :func:`time.monotonic`'s clock."""
    name = spec.name
    if spec.search.confirm < 2:
        return ConfirmResult(None, "confirmation round: off (search.confirm)")
    if spec.search.objective != "throughput":
        return ConfirmResult(None, "confirmation round: skipped (it compares throughput; "
                             f"search.objective is {spec.search.objective!r})")
    repair_stale(storage, name)
    counts = claim_counts(storage, name)
    if counts.live or counts.retries:
        return ConfirmResult(None, "confirmation round: left to the worker that records the "
                             f"last trial ({counts.live} running, {counts.retries} waiting)")
    cands = candidates_of(study, spec)
    if not cands:
        return ConfirmResult(None, "confirmation round: no measured layout")
    complete = sum(1 for _ in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    note = ("no other layout's interval overlaps the best's" if len(cands) == 1
            else noise_cannot_flip(storage, name, cands))
    if note is not None:
        record = confirmation_record(None, cands[:1], state="single", launches=0,
                                     device_s=0.0, complete_trials=complete, note=note)
        set_user_attrs(study, {StudyAttr.CONFIRMATION: record})
        return ConfirmResult(record, "confirmation round: skipped: " + note)
    cost = search_cost(storage, name)
    allowance = Allowance.of(spec.search.confirm_budget, cost,
                             [c.trial_number for c in cands],
                             world_size=Layout.from_key(cands[0].key).world_size,
                             deadline=deadline, batched=launcher.batches)
    while len(cands) > 2 and not first_step_fits(spec, storage, launcher, cands, allowance):
        cands = cands[:-1]  # the farthest rival first: within the budget, the closest
    basis = basis_of(cands)
    claimed = storage.retrying("claiming the confirmation round", lambda: claim_confirmation(
        storage, study_name=name, basis=basis, worker=worker))
    if claimed is ConfirmRefused.DONE:
        # Decided on these candidates already. Trials completed since (slower layouts, a
        # larger budget) did not change them, so the verdict holds for them too.
        found = decided_record(storage, name, basis)
        if found is None:
            return ConfirmResult(None, "confirmation round: decided (no record)")
        found = {**found, "complete_trials": complete}
        set_user_attrs(study, {StudyAttr.CONFIRMATION: found})
        return ConfirmResult(found, f"confirmation round: {decision_line(found)} (kept: "
                             "decided earlier on these candidates, nothing measured now; "
                             f"it cost {found.get('launches', 0)} launches, "
                             f"{float(found.get('device_s') or 0.0):.1f} device-seconds)")
    if not isinstance(claimed, ConfirmClaimed):
        return ConfirmResult(None, "confirmation round: another worker runs it")
    lease = confirmation_lease(storage, claimed.id, worker)
    launcher.clear_abandoned()  # a search trial's lost lease is no concern of the round
    # A lost lease (another worker claimed the round after this one was silent for the
    # grace period) kills the launch at once: the round is the new holder's, and two
    # workers measuring it would store its rounds twice.
    with heartbeat(storage, 0, lease=lease, on_lost=lambda _: launcher.abandon()):
        return _rounds(spec, storage, study, launcher, claimed, cands, worker=worker,
                       signals=signals, say=say, complete=complete, allowance=allowance,
                       lease=lease)


def _lost(lease: Lease, launcher: Launcher) -> bool:
    """Whether the round is another worker's now: its renewal was refused (the heartbeat
    abandoned the launch), or a write of the round was (the launch abandoned likewise)."""
    return lease.lost is not None or launcher.abandoned


def _left(lease: Lease) -> ConfirmResult:
    """The round left to the worker that holds it now: nothing more stored by this one."""
    # Found by the heartbeat's refused renewal or by a refused write, whichever came
    # first (under load, either): the same words for both.
    why = lease.lost or (f"{lease.what}: its lease was taken over (another worker claimed "
                         "it); it is left to the worker that holds it now")
    return ConfirmResult(None, f"{why}: its launch is cancelled, nothing more is stored; "
                         "the best below is unconfirmed")


def _stop_request(launcher: Launcher, signals: StopSignals | None) -> str | None:
    if signals is not None and signals.received is not None:
        import signal as _signal

        return "sigterm" if signals.received == _signal.SIGTERM else "interrupt"
    return "interrupt" if launcher.cancelled else None


def _rounds(spec: StudySpec, storage: Storage, study: optuna.Study, launcher: Launcher,
            claimed: ConfirmClaimed, cands: list[ConfirmCandidate], *, worker: str,
            signals: StopSignals | None, say: Callable[[str], None],
            complete: int, allowance: Allowance, lease: Lease) -> ConfirmResult:
    keys = [c.key for c in cands]
    by_key = {c.key: c for c in cands}
    stored = stored_runs(storage, claimed.id)
    done_rounds = 1 + max((r["round"] for r in stored), default=-1)
    launches, device_s = claimed.launches, claimed.device_s
    allowance.observe(device_s, len(stored))
    rotating = rotates(launcher)
    cap = spec.search.confirm_max_rounds
    held = rotating and held_idle_s(launcher, allowance.world_size) is not None
    if rotating:
        # One launch: the rounds its plan affords are known before it starts, and the
        # verdict counts its looks on them likewise.
        cap = planned_rounds(spec, storage, launcher, cands, allowance, done=done_rounds,
                             spent_device_s=device_s)
    else:
        # Each run its own launch: the budget's rounds are known before the first look, so
        # the verdict counts its looks on them and the last of them decides (a verdict
        # taken on 4 paid rounds, not "not decided" after a refused 5th and 6th).
        cap = allowance.rounds_within(cap, len(keys), done_rounds, device_s,
                                      step=ROUNDS_PER_STEP)
    bound = (f"{cap} rounds at most" if cap == spec.search.confirm_max_rounds else
             f"{cap} rounds at most (what the budget affords of "
             f"search.confirm_max_rounds {spec.search.confirm_max_rounds})")
    if claimed.resumed:
        say(f"confirmation round: resumed after {done_rounds} stored round(s), {bound}")
    else:
        say(f"confirmation round: {', '.join(keys)} side by side, {bound}, "
            f"{_budget_words(allowance)}"
            + (", in the search's last launch (held for it: no start-up)" if held else ""))
    same_launch = launcher.batches
    launch = None if same_launch else launch_noise(storage, spec.name)
    decision = decide(stored, keys, cap, margin=_assumed(spec), same_launch=same_launch,
                      launch=launch)
    out_of_budget: str | None = None
    trials = {c.key: c.trial_number for c in cands}

    def _settles(new: list[dict[str, Any]]) -> bool:
        """Asked inside a rotating launch; each unsettled round is told as it comes."""
        runs = stored + new
        found = decide(runs, keys, cap, margin=_assumed(spec), same_launch=same_launch,
                       launch=launch)
        if found is not None and settled(found, cap):
            return True  # told after the launch, with its cost
        told.add(len({r["round"] for r in runs}))
        say(f"confirmation round {len({r['round'] for r in runs})}/{cap}: "
            + shown(found, runs, cands, complete) + " (measuring on)")
        return False

    told: set[int] = set()  # the rounds told inside a launch: each is told once
    while decision is None or not settled(decision, cap):
        if _lost(lease, launcher):
            return _left(lease)
        ended = _stop_request(launcher, signals)
        if ended is not None:
            release_confirmation(storage, claimed.id, worker)
            return ConfirmResult(None, "confirmation round: interrupted; the best below is "
                                 "unconfirmed; the next run goes on from its "
                                 f"{done_rounds} stored round(s)", ended=ended)
        want = MIN_ROUNDS - done_rounds if done_rounds < MIN_ROUNDS else ROUNDS_PER_STEP
        want = min(want, cap - done_rounds)
        if want <= 0:
            break
        step = None
        if rotating:
            step = rotate_rounds(spec, storage, launcher, claimed.id, trials, keys,
                                 first_round=done_rounds, rounds_left=cap - done_rounds,
                                 allowance=allowance, spent_device_s=device_s, worker=worker,
                                 settles=_settles)
            if _lost(lease, launcher):
                return _left(lease)
            if step.apart is not None:
                say(f"confirmation round: {step.apart}")
                rotating = False
                # The launch that found it out is recorded with its cost: it counts too.
                launches, device_s = launches + step.launches, device_s + step.device_s
                continue
        refused = step.refusal if step is not None else \
            allowance.refusal(want * len(keys), device_s)
        if refused is not None and refused[0] == "timeout":
            release_confirmation(storage, claimed.id, worker)
            return ConfirmResult(None, f"confirmation round: stopped at the wall-time limit "
                                 f"({refused[1]}); the best below is unconfirmed; the next "
                                 f"run goes on from its {done_rounds} stored round(s)",
                                 ended="timeout")
        if refused is not None:
            out_of_budget = refused[1]
            break
        if step is not None:  # its complete rounds are recorded already, cost included
            new_runs, step_launches, step_device_s = step.runs, step.launches, step.device_s
            if not (want := len({r["round"] for r in new_runs})):
                break  # no round measured (a failed launch, or none left): no relaunch
        else:
            new_runs, step_launches, step_device_s = measure_rounds(
                spec, launcher, claimed.id, by_key, keys,
                range(done_rounds, done_rounds + want), worker=worker)
            if _lost(lease, launcher) or _stop_request(launcher, signals) is not None:
                continue  # cut short: its runs are not stored (the checks above end it)
            if not record_step(storage, claimed.id, spec.name, new_runs, step_launches,
                               step_device_s, worker=worker):
                return _left(lease)
        launches, device_s = launches + step_launches, device_s + step_device_s
        stored += new_runs
        allowance.observe(device_s, len(stored))
        done_rounds += want
        if step is not None and _stop_request(launcher, signals) is not None:
            continue  # the rounds measured before the interrupt are stored
        decision = decide(stored, keys, cap, margin=_assumed(spec), same_launch=same_launch,
                          launch=launch)
        spent = f"{device_s:.1f} device-s spent{_of_budget(allowance)}"
        say(f"confirmation round: {done_rounds} rounds measured; {spent}"
            if done_rounds in told else
            f"confirmation round {done_rounds}/{cap}: "
            f"{shown(decision, stored, cands, complete)}; {spent}")
        if step is not None and step.budget_spent:
            break  # the budget paid for these rounds and no more: they decide
    if decision is None or (out_of_budget is not None and not settled(decision, cap)):
        state = "budget" if out_of_budget is not None else "failed"
        note = out_of_budget if out_of_budget is not None else "every round had a failed run"
        record = confirmation_record(decision if state == "budget" and decision else None,
                                     cands, state=state, launches=launches,
                                     device_s=device_s, complete_trials=complete, note=note)
        # The single pass's best stands, whatever the unfinished rounds lean to.
        record.update(winner=cands[0].key, winner_trial=cands[0].trial_number)
    else:
        record = confirmation_record(decision, cands, state="decided", launches=launches,
                                     device_s=device_s, complete_trials=complete,
                                     favours=favoured(stored, keys, cands[0].key))
    # "budget": left open, a later run with a larger budget goes on from its stored rounds.
    kept = (release_confirmation(storage, claimed.id, worker) if record["state"] == "budget"
            else finish_confirmation(storage, claimed.id, record, worker))
    if not kept:  # taken over since the last heartbeat: the verdict is the holder's
        return _left(lease)
    set_user_attrs(study, {StudyAttr.CONFIRMATION: record})
    return ConfirmResult(record, f"confirmation round: {decision_line(record)}; "
                         + cost_line(record))


def _budget_words(allowance: Allowance) -> str:
    budget = allowance.budget_device_s
    return "no device budget" if budget is None else f"a budget of {budget:.1f} device-s"


def _of_budget(allowance: Allowance) -> str:
    return (f" of {allowance.budget_device_s:.1f}" if allowance.budget_device_s is not None
            else "")
