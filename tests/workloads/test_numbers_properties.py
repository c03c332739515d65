"""Property tests (issue 23, D/E): whatever a trial's output holds, the result loader and the
read-back either give numbers that can be stored and ranked, or refuse them with an error
naming the field; they never raise anything else, and nothing non-finite, non-positive or
of the wrong type becomes a ``complete`` outcome."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config.model import ModelConfig
from autotune.errors import SpecError
from autotune.layout import Layout
from autotune.trial import LaunchReport, TrialResult, read_result
from autotune.trial.classify import classify, storable
from autotune.trial.numbers import check_result_numbers
from autotune.workloads.readback import measure, parse_log_line, read_back

MODEL = ModelConfig(n_layer=2, hidden=64, n_head=4, seq_len=64, vocab_size=256, ffn_hidden=256)
LAYOUT = Layout(tp=1, pp=1, dp=2, micro_batch=2, grad_accum=4)
FIELDS = sorted(set(TrialResult.__dataclass_fields__) - {"extra"})

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                    st.sampled_from([0, 0.0, -0.0, 1e-300, 5e-324, 1e308, 10**400, -1]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
# Result-like objects: the known keys (and a few others) with any JSON value, a real status
# most of the time, so that the checks past the status are reached.
results = st.one_of(
    json_values,
    st.builds(lambda status, known, other: {"status": status, **known, **other},
              st.sampled_from(["ok", "ok", "oom", "error", "fast"]),
              st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8),
              st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def _storable(res: TrialResult) -> None:
    """What the runner stores of it: strict JSON (the attributes, the result file)."""
    json.dumps(res.to_dict(), allow_nan=False)
    check_result_numbers(res.to_dict())


def _outcome_is_sane(report: LaunchReport) -> None:
    before = (report.result, report.result_error, report.verdict)
    outcome = classify(report)
    assert (report.result, report.result_error, report.verdict) == before  # pure
    if outcome.kind in ("complete", "stopped"):
        assert isinstance(outcome.value, float)
        assert math.isfinite(outcome.value) and outcome.value > 0
    recorded = storable(report)  # what the runner records
    assert classify(recorded) == outcome
    if recorded.result is not None:
        _storable(recorded.result)
    json.dumps(outcome.reason)


@SETTINGS
@given(data=results)
def test_the_result_loader_refuses_by_name_or_gives_storable_numbers(
        tmp_path: Path, data: Any) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))  # Infinity, NaN as Python's json writes them
    try:
        res = read_result(path)
    except SpecError as err:
        assert "result" in str(err)
        res, error = None, str(err)
    else:
        assert res is not None
        _storable(res)
        error = None
    _outcome_is_sane(LaunchReport(result=res, returncode=0, result_error=error))


@SETTINGS
@given(data=results)
def test_a_result_built_in_memory_is_checked_where_it_is_classified(data: Any) -> None:
    if not isinstance(data, dict) or data.get("status") not in ("ok", "oom", "error"):
        return
    known = {k: v for k, v in data.items() if k in FIELDS}
    try:
        res = TrialResult(**known)  # no check here: a replayed table, say
    except (TypeError, SpecError):
        return
    report = LaunchReport(result=res, returncode=0)
    _outcome_is_sane(report)


_TEMPLATES = [
    " iteration {step}/{total} | consumed samples: 8 | elapsed time per iteration (ms): {x} |"
    " lm loss: {y} | TFLOPs: {z} |",
    " iteration={step}/{total} | elapsed_time_per_iteration_ms={x} | lm loss={y} |"
    " [LM]TFLOPs={z} | [DS]TFLOPs={z} |",
    "steps: {step} loss: {y} iter time (s): {x} samples/sec: {z}",
    "[Rank 0] (after 1 iterations) memory (MB) | allocated: {x} | max allocated: {z} |"
    " reserved: 1 | max reserved: 1",
]
number_text = st.one_of(
    st.sampled_from(["0.0", "0", "-1.5", "1e-300", "1e400", "nan", "inf", "5e-324", "1e308",
                     "9" * 5000, ".5", "+3"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-10**6, max_value=10**6).map(str))
step_text = st.one_of(st.integers(min_value=0, max_value=50).map(str),
                      st.sampled_from(["9" * 5000, "007"]))
log_lines = st.one_of(
    st.text(max_size=80),
    st.builds(lambda t, step, total, x, y, z: t.format(step=step, total=total, x=x, y=y, z=z),
              st.sampled_from(_TEMPLATES), step_text, step_text, number_text, number_text,
              number_text))
metrics_lines = st.one_of(
    st.text(max_size=40),
    json_values.map(json.dumps),
    st.builds(lambda step, seconds, extra: json.dumps({"step": step, "seconds": seconds,
                                                      **extra}),
              st.one_of(st.integers(min_value=0, max_value=30), json_values),
              st.one_of(numbers, json_values),
              st.dictionaries(st.sampled_from(["tokens", "peak_memory_bytes", "loss"]),
                              st.one_of(numbers, json_values), max_size=3)))


@SETTINGS
@given(log=st.lists(log_lines, max_size=12), metrics=st.lists(metrics_lines, max_size=12),
       drop=st.integers(min_value=0, max_value=3))
def test_the_read_back_refuses_by_name_or_measures_storable_numbers(
        tmp_path: Path, log: list[str], metrics: list[str], drop: int) -> None:
    for line in log:
        parse_log_line(line)  # never raises
    metrics_path, log_path = tmp_path / "metrics.jsonl", tmp_path / "stdout.log"
    metrics_path.write_text("\n".join(metrics) + "\n")
    log_path.write_text("\n".join(log) + "\n")
    rb = read_back(metrics_path, [log_path], drop=drop)
    json.dumps(rb.summary(), allow_nan=False)
    # What ForeignWorkload.finish does with it.
    try:
        res = measure(rb, model=MODEL, layout=LAYOUT, dtype="fp32", device="cpu",
                      peak_flops=1e12, expected_steps=4)
        if res is not None:
            check_result_numbers(res.to_dict())
    except SpecError as err:
        assert "step_times_s" in err.field or err.field.startswith("result.")
        return
    if res is not None:
        _storable(res)
        _outcome_is_sane(LaunchReport(result=res, returncode=0, workload="command",
                                      readback={**rb.summary(), "expected": 4}))


def test_a_memory_line_too_large_for_a_float_measures_nothing() -> None:
    line = ("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1.0 | max allocated: {} | "
            "reserved: 2.0 | max reserved: 3.0")
    assert parse_log_line(line.format("1e400")) is None
    assert parse_log_line(line.format("12.5")) == ("max_allocated_bytes", 12.5 * 1024 * 1024)
