"""What a trial and a study store: every key named once, written and read back the same."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.layout import Layout
from autotune.storage.keys import RESULT_ATTRS, SKIPPED, TrialAttr
from autotune.storage.records import (
    TrialFacts,
    is_retry,
    retry_attrs,
    trial_layout,
    trial_layout_key,
    trial_outcome,
    trial_reason,
    user_attrs,
    verdict_attrs,
)
from autotune.storage.study_records import search_stop_line, search_stop_record
from autotune.trial import TrialResult
from autotune.trial.outcome import Verdict

LAYOUT = Layout(tp=2, pp=1, dp=2, micro_batch=2, grad_accum=2, zero_stage=1)
AUTOTUNE = Path(__file__).resolve().parents[2] / "autotune"


def _facts(outcome: Verdict | None, result: TrialResult | None) -> TrialFacts:
    t0 = datetime(2025, 1, 1)
    return TrialFacts(study_name="s", trial_number=3, trial_id=4, layout=LAYOUT,
                      outcome=outcome, result=result, launcher="local", worker="h:1",
                      started_at=t0, finished_at=t0, elapsed_s=12.345, hosts=["h"],
                      predicted_tflops_per_device=100.0, predicted_memory_bytes=2**31)


def _frozen(attrs: dict, state: TrialState = TrialState.COMPLETE) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(state=state, value=1.0 if state == TrialState.COMPLETE
                                     else None, user_attrs=attrs)


def test_a_measured_trial_reads_back_its_layout_outcome_and_result() -> None:
    result = TrialResult(status="ok", model_tflops_per_device=150.0, step_time_s=0.5,
                         peak_memory_bytes=3 * 2**30, device="cuda", versions={"torch": "2"})
    attrs = user_attrs(_facts(Verdict("complete", value=150.0), result))
    trial = _frozen(attrs)
    assert trial_layout(trial) == LAYOUT and trial_layout_key(trial) == LAYOUT.key()
    assert trial_outcome(trial) == "complete" and trial_reason(trial) == ""
    assert attrs[TrialAttr.MODEL_TFLOPS] == 150.0 and attrs[TrialAttr.PEAK_MEMORY_GIB] == 3.0
    assert attrs[TrialAttr.PREDICTED_MEMORY_GIB] == 2.0 and attrs[TrialAttr.ELAPSED_S] == 12.35
    assert set(RESULT_ATTRS) <= set(vars(result))  # copied from result fields of that name
    assert not is_retry(attrs, {})


def test_verdicts_and_retries_are_recorded_with_the_same_keys() -> None:
    attrs = verdict_attrs(LAYOUT, SKIPPED, "another trial owns this layout")
    trial = _frozen(attrs, TrialState.PRUNED)
    assert trial_layout(trial) == LAYOUT and trial_outcome(trial) == SKIPPED
    assert trial_reason(trial) == "another trial owns this layout"
    assert TrialAttr.WORKER not in attrs
    assert verdict_attrs(LAYOUT, "infeasible", "x", worker="h:1")[TrialAttr.WORKER] == "h:1"
    assert is_retry(retry_attrs(3), {}) and is_retry({}, {"failed_trial": 3})
    assert trial_layout(_frozen({})) is None and trial_outcome(_frozen({})) is None


def test_a_search_stop_reads_as_one_line() -> None:
    record = search_stop_record("EI 0.2% < 1%", judged=6, strategy="default",
                                min_improvement=0.01, worker="h:1", at=datetime(2025, 1, 1))
    assert search_stop_line(record) == "EI 0.2% < 1% (search.min_improvement 0.01)"
    assert search_stop_line(None) is None and search_stop_line({"reason": ""}) is None


def test_no_attribute_key_is_spelled_out_elsewhere_in_autotune() -> None:
    """Like SQL columns in storage/schema.py: keys of trial and study attributes live in
    storage/keys.py, written and read by storage/records.py and storage/study_records.py;
    everywhere else (storage/claims.py included) names them by its
    constants: no ``user_attrs.get("...")``, ``attrs["..."] =``, ``user_attrs={"...": ``,
    and no trial attribute key as a dict literal's key."""
    keys = {v for v in vars(TrialAttr).values() if isinstance(v, str) and not v.startswith("_")
            and v.islower()} - {"autotune.storage.keys"}
    bare = re.compile(r"""(user_attrs\.get\(|user_attrs\[|set_user_attr\(|attrs\[|"""
                      r"""user_attrs=\{)\s*["']""")
    literal_key = re.compile(r"""[{,]\s*["']([a-z_]+)["']\s*:""")
    offenders = [f"{path.relative_to(AUTOTUNE)}:{n}"
                 for path in sorted(AUTOTUNE.rglob("*.py"))
                 if path.name not in ("records.py", "study_records.py")
                 for n, line in enumerate(path.read_text().splitlines(), start=1)
                 if bare.search(line) or (
                     "user_attrs" in line and any(k in keys for k in literal_key.findall(line)))]
    assert offenders == []


def test_the_key_check_can_fail() -> None:
    """The pattern of the test above catches what storage/claims.py used to write."""
    bare = re.compile(r"""(user_attrs\.get\(|user_attrs\[|set_user_attr\(|attrs\[|"""
                      r"""user_attrs=\{)\s*["']""")
    assert bare.search('rdb.finish_trial(s, tid, user_attrs={"outcome": "killed"})')
    assert bare.search('attrs["retry_of"] = 3')
    assert not bare.search("attrs[TrialAttr.RETRY_OF] = 3")


def test_a_claim_time_row_has_no_outcome_yet() -> None:
    """A claim's ``measurements`` row is built without a placeholder verdict: ``running``,
    no reason, no result; a trial without an outcome has no user attributes to record."""
    from autotune.config.cluster import ClusterConfig
    from autotune.config.model import MODEL_PRESETS
    from autotune.storage.keys import RUNNING
    from autotune.storage.records import measurement_row

    row = measurement_row(_facts(None, None), model=MODEL_PRESETS["tiny"],
                          cluster=ClusterConfig(devices_per_node=4), global_batch=8,
                          dtype="fp32")
    assert row["outcome"] == RUNNING and row["reason"] is None and row["status"] is None
    with pytest.raises(ValueError, match="no outcome yet"):
        user_attrs(_facts(None, None))
