"""The confirmation round (issue #24): re-measuring the top layouts side by side names the
true best where a single pass under drift does not; its decision, its resumption, and
what ``status`` and ``best`` say. Replay launcher and SQLite only: seconds."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.launchers import make_launcher
from autotune.report.results import format_statuses, selected_trial, study_status
from autotune.runner.confirm import candidates_of
from autotune.runner.study import run_study
from autotune.spec import StudySpec, load_study
from autotune.storage.confirmations import (
    ConfirmClaimed,
    ConfirmRefused,
    claim_confirmation,
    record_round,
    release_confirmation,
    stored_runs,
    unfinished_line,
)
from autotune.storage.db import Storage, open_storage
from autotune.trial.paired import (
    ConfirmCandidate,
    Noise,
    min_rounds,
    overlapping,
    paired_decision,
    settled,
)
from tests.helpers import write_study

HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
          "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n")
# gpus, gb, mb, tp, dp, pp, ms: the true best (tp2 mb1, 100 ms), a close rival (tp2 mb2,
# 103 ms) and a clearly slower layout (tp4, 130 ms: its interval overlaps no one's).
ROWS = [(4, 8, 1, 2, 2, 1, 100.0), (4, 8, 2, 2, 2, 1, 103.0), (4, 8, 1, 4, 1, 1, 130.0)]


def _study(tmp_path: Path, *, confirm: int, drift: list[dict[str, Any]] | None = None,
           name: str = "drifty", budget: float = 10.0,
           search: dict[str, Any] | None = None,
           trial: dict[str, Any] | None = None) -> StudySpec:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "table.csv").write_text(HEADER + "\n".join(
        f"{g},{gb},{mb},1024,16,12,1024,{tp},{dp},{pp},{ms}"
        for g, gb, mb, tp, dp, pp, ms in ROWS) + "\n")
    replay: dict[str, Any] = {"landscape": str(tmp_path / "table.csv")}
    if drift:
        replay["drift"] = drift
    path = write_study(
        tmp_path / f"{name}-{confirm}.yaml", name=name, n_trials=3,
        db=tmp_path / "confirm.db",
        model={"n_layer": 12, "hidden": 1024, "n_head": 16, "seq_len": 1024,
               "attention": "explicit"},
        cluster={"nodes": 1, "devices_per_node": 4, "device": "a100-80gb"},
        training={"global_batch": 8, "dtype": "bf16"},
        search={"strategy": "grid", "n_trials": 3, "confirm": confirm,
                "confirm_budget": budget, **(search or {})},
        **({"trial": trial} if trial else {}),
        storage={"url": f"sqlite:///{tmp_path / 'confirm.db'}", "heartbeat_interval_s": 1,
                 "grace_period_s": 30},
        launcher={"kind": "replay", "run_dir": str(tmp_path / "runs"), "replay": replay})
    return load_study(path)


def _key(spec: StudySpec, mb: int, tp: int) -> str:
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training)
    table = launcher.fixed_layouts()
    assert table is not None
    return next(lay.key() for lay in table if lay.micro_batch == mb and lay.tp == tp)


def _run(spec: StudySpec, storage: Storage | None = None,
         **kw: Any) -> tuple[Any, optuna.Study]:
    storage = storage or open_storage(spec.storage)
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training)
    summary = run_study(spec, storage, launcher, **kw)
    return summary, optuna.load_study(study_name=spec.name, storage=storage.optuna)


# -- the pure decision ------------------------------------------------------------------

def test_the_paired_decision_takes_two_rounds_and_the_known_noise() -> None:
    assert min_rounds() == 2
    quiet = Noise(run_var=1e-4, prior_var=1e-4, prior_df=20)  # runs known to ~1%
    steady = [{"a": 1.03, "b": 1.0, "c": 0.8}] * 2
    d = paired_decision(steady, noise=quiet)
    assert (d.winner, d.runner_up, d.distinguishable) == ("a", "b", True)
    assert d.ratio == pytest.approx(1.03)
    # The same two rounds from runs known to only 5% each: a 3% lead is not enough.
    loose = Noise(run_var=2 * (0.05 / 1.96) ** 2, prior_var=2 * (0.05 / 1.96) ** 2,
                  prior_df=8)
    assert not paired_decision(steady, noise=loose).distinguishable
    assert not settled(paired_decision(steady, noise=loose, margin=0.01), 12)
    assert settled(paired_decision(steady, noise=loose), 2)  # the cap
    # Nothing known beforehand: two rounds that disagree leave it open; no noise known
    # and no spread (a replayed table) decides at once.
    mixed = [{"a": 1.05, "b": 1.0}, {"a": 1.0, "b": 1.04}]
    assert not paired_decision(mixed).distinguishable
    assert not settled(paired_decision(mixed), 12)
    assert paired_decision(steady).distinguishable
    # Equally fast, known precisely: equivalent, settled, never distinguishable.
    even = [{"a": 1.001, "b": 1.0}, {"a": 1.0, "b": 1.001}]
    tie = paired_decision(even, noise=quiet)
    assert tie.equivalent and settled(tie, 12) and not tie.distinguishable
    assert tie.within_pct is not None and tie.within_pct < 5.0
    assert paired_decision(steady[:1]).interval is None
    # The verdict is about the pairs, not the sums: a drifting round moves both members.
    drifting = [{"a": 2.06 * f, "b": 2.0 * f} for f in (1.0, 0.5, 1.5, 0.7)]
    assert paired_decision(drifting, noise=quiet).winner == "a"
    assert paired_decision(drifting, noise=quiet).distinguishable
    with pytest.raises(ValueError):
        paired_decision([{"a": 1.0, "b": 1.0}, {"a": 1.0}])


def test_the_candidates_are_the_layouts_whose_intervals_overlap_the_best() -> None:
    cands = [ConfirmCandidate("a", 0, 10.0, 0.05), ConfirmCandidate("b", 1, 9.5, None),
             ConfirmCandidate("c", 2, 9.3, 0.01), ConfirmCandidate("d", 3, 9.0, 0.2),
             ConfirmCandidate("e", 4, 5.0, 0.05)]
    # a's interval starts at 10/1.05 = 9.52; b (assumed 5%) reaches 10.0, c 9.39 (out),
    # d (a wide 20%) 11.25; e is far off.
    assert [c.key for c in overlapping(cands, 3, assumed_precision=0.05)] == ["a", "b", "d"]
    assert [c.key for c in overlapping(cands, 2, assumed_precision=0.05)] == ["a", "b"]
    assert [c.key for c in overlapping(cands, 3, assumed_precision=0.0)] == ["a", "d"]


# -- the round on a drifting replay -------------------------------------------------------

DRIFT_ON_BEST = [{"layout": "KEY", "factors": [1.06, 1.06, 1.06, 1.0]}]
"""The true best ran 6% slow while the single pass measured it (its first three answers:
a neighbour's job), as fast as it is afterwards."""


def test_under_drift_the_confirmation_round_names_the_true_best(tmp_path: Path,
                                                                capsys: Any) -> None:
    probe = _study(tmp_path / "single", confirm=0)
    best_key, rival_key = _key(probe, mb=1, tp=2), _key(probe, mb=2, tp=2)
    drift = [{**DRIFT_ON_BEST[0], "layout": best_key}]

    single, single_study = _run(_study(tmp_path / "single", confirm=0, drift=drift))
    assert single.best is not None and single.best.user_attrs["layout"] == rival_key
    assert "confirmation" not in single_study.user_attrs

    spec = _study(tmp_path / "confirmed", confirm=3, drift=drift)
    storage = open_storage(spec.storage)
    summary, study = _run(spec, storage)
    assert summary.best is not None and summary.best.user_attrs["layout"] == best_key
    selected = selected_trial(study)
    assert selected is not None and selected.user_attrs["layout"] == best_key
    record = summary.confirmation
    assert record is not None and record["state"] == "decided"
    assert (record["winner"], record["runner_up"]) == (best_key, rival_key)
    assert record["distinguishable"] and record["rounds"] == 2
    assert record["ratio"] == pytest.approx(1.03)
    assert record["candidates"] == [rival_key, best_key]  # tp4 (130 ms) overlaps no one
    # Replay runs each run alone, interleaved: A B, B A (2 rounds x 2 layouts), 4 launches.
    assert record["launches"] == 4 and record["device_s"] >= 0.0
    trials = study.get_trials()
    assert len(trials) == 3 and all(t.state == TrialState.COMPLETE for t in trials)
    runs = stored_runs(storage, 1)
    assert len(runs) == 4 and {r["outcome"] for r in runs} == {"complete"}
    # Rounds alternate the order (A B, B A, ...): a drift linear in time favours no slot.
    firsts = [r["layout_key"] for r in runs if r["slot"] == 0]
    assert firsts[0] != firsts[1]

    status = format_statuses([study_status(study)])
    assert (f"drifty: confirmation: best {best_key} 1.03x the runner-up {rival_key}, "
            "95% interval [1.03, 1.03], 2 paired rounds: distinguishable; "
            "confirmation cost: 4 launches") in status
    from autotune.report.build import _best
    from autotune.report.frames import trials_frame

    # The report's "Best layouts": the verdict, and the winner's (mb 1) launch arguments.
    section = " ".join(getattr(b, "text", "") for b in _best(study, trials_frame(study)).blocks)
    assert f"best {best_key} 1.03x the runner-up {rival_key}" in section
    assert "--micro-batch-size 1 " in section
    capsys.readouterr()
    assert main(["best", str(spec.source), "--emit", "json"]) == 0
    out = capsys.readouterr()
    shown = json.loads(out.out)
    assert shown["trial"] == selected.number
    assert shown["confirmation"]["winner"] == best_key and not shown["confirmation"]["stale"]
    assert "distinguishable" in out.err


def test_a_killed_confirmation_round_is_resumed_from_its_stored_rounds(tmp_path: Path) -> None:
    spec = _study(tmp_path, confirm=3)
    storage = open_storage(spec.storage)
    _run(_study(tmp_path, confirm=0), storage)  # the search alone: 3 trials, budget reached
    study = optuna.load_study(study_name=spec.name, storage=storage.optuna)
    cands = candidates_of(study, spec)
    assert len(cands) == 2
    basis = ",".join(str(c.trial_number) for c in sorted(cands, key=lambda c: c.trial_number))
    # A runner of this host that no longer exists claimed it and stored one round.
    dead = f"{socket.gethostname()}:{2**22 + 12345}"
    claimed = claim_confirmation(storage, study_name=spec.name, basis=basis, worker=dead)
    assert isinstance(claimed, ConfirmClaimed)
    for n in range(1):
        record_round(storage, claimed.id, study_name=spec.name, launches=2, device_s=0.01,
                     runs=[{"round": n, "slot": i, "layout_key": c.key,
                            "trial_number": c.trial_number, "outcome": "complete",
                            "model_tflops_per_device": c.value, "world_size": 4,
                            "launcher": "replay", "worker": dead}
                           for i, c in enumerate(cands)])
    summary, study = _run(spec, storage)
    record = summary.confirmation
    assert record is not None and record["state"] == "decided" and record["rounds"] == 2
    # 1 stored round (2 launches, as recorded) and 1 measured now (B A: 2 launches).
    assert record["launches"] == 2 + 2
    assert len(stored_runs(storage, claimed.id)) == 4
    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]
    assert len(study.get_trials()) == 3  # no confirmation run is a trial
    # Done: a further run neither measures nor claims it again.
    again = claim_confirmation(storage, study_name=spec.name, basis=basis, worker="x:1")
    assert again is ConfirmRefused.DONE
    # A trial completed since, that joins no candidates (here: as if), leaves the verdict
    # standing: the next run refreshes it without measuring.
    study.set_user_attr("confirmation", {**record, "complete_trials": 2})
    assert "stale" in (format_statuses([study_status(study)]))
    summary2, study = _run(spec, storage)
    assert summary2.confirmation is not None and summary2.confirmation["rounds"] == 2
    assert len(stored_runs(storage, claimed.id)) == 4
    assert "stale" not in format_statuses([study_status(study)])


def test_a_live_claim_leaves_the_round_to_its_worker(tmp_path: Path) -> None:
    spec = _study(tmp_path, confirm=3)
    storage = open_storage(spec.storage)
    _run(_study(tmp_path, confirm=0), storage)
    study = optuna.load_study(study_name=spec.name, storage=storage.optuna)
    basis = ",".join(sorted((str(c.trial_number) for c in candidates_of(study, spec)),
                            key=int))
    other = claim_confirmation(storage, study_name=spec.name, basis=basis,
                               worker="another-host:1")
    assert isinstance(other, ConfirmClaimed)
    summary, _ = _run(spec, storage)
    assert summary.confirmation is None
    assert stored_runs(storage, other.id) == []
    assert unfinished_line(storage, spec.name) == ("running in another-host:1, 0 round(s) "
                                                   "stored")
    release_confirmation(storage, other.id)
    assert unfinished_line(storage, spec.name).startswith("unfinished, 0 round(s) stored")


def test_search_confirm_is_validated(tmp_path: Path) -> None:
    from autotune.config.study import SearchConfig
    from autotune.errors import SpecError

    assert SearchConfig.from_dict({"confirm": False}).confirm == 0
    assert SearchConfig().confirm == 3
    for bad in (1, -1, 17, True, "3"):
        with pytest.raises(SpecError, match=r"search\.confirm"):
            SearchConfig.from_dict({"confirm": bad})
    with pytest.raises(SpecError, match=r"search\.confirm_max_rounds"):
        SearchConfig.from_dict({"confirm_max_rounds": 1})
    assert SearchConfig().confirm_budget == 0.25
    for bad in (-0.1, "a", True, float("inf")):
        with pytest.raises(SpecError, match=r"search\.confirm_budget"):
            SearchConfig.from_dict({"confirm_budget": bad})
