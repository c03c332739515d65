"""The confirmation round's decision rule, measured: its error rate on replayed tables with
injected drift, against the rate :mod:`autotune.trial.paired` states (5% for two equally
fast layouts called distinguishable, 2.5% for the slower one named), and how few rounds a
quiet machine needs. Pure: the rule is fed the runs a drifting replay would store, in the
round's A B, B A order, step by step as :mod:`autotune.runner.confirm` takes it."""

from __future__ import annotations

import math
import random
from typing import Any

from autotune.runner.confirm_budget import LaunchNoise
from autotune.runner.confirm_verdict import decide
from autotune.trial.paired import MIN_ROUNDS, ROUNDS_PER_STEP, settled

CAP = 12
REPS = 600


def _sequential(rng: random.Random, ms: dict[str, float], *, walk: float, jitter: float,
                jump: float = 0.0, precision: float | None = None,
                same_launch: bool = False,
                launch: LaunchNoise | None = None) -> tuple[Any, int]:
    """One round, to its verdict: each answer's step time is the table's times a common
    factor that random-walks from answer to answer (log-sd ``walk``), a neighbour's job
    that slows everything by ``jump`` from a random answer on, and each run's own jitter
    (log-sd ``jitter``). Returns the decision and the runs measured."""
    keys = sorted(ms)
    level, answer, runs = 0.0, 0, []
    start_jump = rng.randrange(CAP * len(keys))
    decision, rounds = None, 0
    while decision is None or not settled(decision, CAP):
        want = MIN_ROUNDS - rounds if rounds < MIN_ROUNDS else ROUNDS_PER_STEP
        want = min(want, CAP - rounds)
        if want <= 0:
            break
        for n in range(rounds, rounds + want):
            for slot, key in enumerate(keys if n % 2 == 0 else keys[::-1]):
                level += rng.gauss(0.0, walk)
                slow = math.exp(level + rng.gauss(0.0, jitter)) * (
                    1.0 + jump if answer >= start_jump else 1.0)
                answer += 1
                runs.append({"round": n, "slot": slot, "layout_key": key,
                             "outcome": "complete", "measure_precision": precision,
                             "model_tflops_per_device": 1000.0 / (ms[key] * slow)})
        rounds += want
        decision = decide(runs, keys, CAP, margin=0.05, same_launch=same_launch,
                          launch=launch)
    return decision, len(runs)


def _rates(ms: dict[str, float], faster: str | None, **kw: Any) -> dict[str, float]:
    rng = random.Random(12345)
    wrong = called = 0
    runs = 0
    for _ in range(REPS):
        d, n = _sequential(rng, ms, **kw)
        runs += n
        if d.distinguishable:
            called += 1
            wrong += faster is None or d.winner != faster
    return {"wrong": wrong / REPS, "called": called / REPS, "runs_per_layout":
            runs / REPS / len(ms)}


def test_equally_fast_layouts_are_rarely_called_distinguishable_under_drift() -> None:
    equal = {"a": 100.0, "b": 100.0}
    # Nothing known beforehand (a fresh study of a user's program): the rounds' own spread.
    assert _rates(equal, None, walk=0.02, jitter=0.01, jump=0.2)["wrong"] <= 0.05
    # The launch-to-launch noise known from the study's repeats (true value, 10 df).
    known = LaunchNoise(var=0.02 ** 2 + 0.01 ** 2, df=10)
    assert _rates(equal, None, walk=0.02, jitter=0.01, launch=known)["wrong"] <= 0.05
    # In one launch (the built-in trainer), each run known to its precision (1.96 sd).
    assert _rates(equal, None, walk=0.005, jitter=0.01, precision=0.0196 * 1.5,
                  same_launch=True)["wrong"] <= 0.05


def test_the_slower_layout_is_rarely_named_and_a_quiet_machine_decides_in_two() -> None:
    table = {"a": 100.0, "b": 103.0}
    noisy = _rates(table, "a", walk=0.02, jitter=0.01, jump=0.2)
    assert noisy["wrong"] <= 0.025
    # A quiet machine, its launch noise known from repeats: 2 launches per candidate.
    quiet = _rates(table, "a", walk=0.002, jitter=0.003,
                   launch=LaunchNoise(var=0.002 ** 2 + 0.003 ** 2, df=10))
    assert quiet["wrong"] <= 0.025 and quiet["called"] >= 0.95
    assert quiet["runs_per_layout"] <= 2.2


def test_not_distinguishable_names_whom_the_rounds_favour_over_the_single_pass() -> None:
    from autotune.runner.confirm_verdict import favoured

    def runs(values: list[dict[str, float]]) -> list[dict[str, Any]]:
        return [{"round": n, "layout_key": k, "outcome": "complete",
                 "model_tflops_per_device": v} for n, r in enumerate(values)
                for k, v in r.items()]

    # b beat the single pass's a in 2 of 3 rounds and on the whole: b is favoured.
    assert favoured(runs([{"a": 1.0, "b": 1.02}, {"a": 1.0, "b": 1.01},
                          {"a": 1.0, "b": 0.99}]), ["a", "b"], "a") == "b"
    # Half the rounds each way: no majority, the single pass's best is kept.
    assert favoured(runs([{"a": 1.0, "b": 1.05}, {"a": 1.0, "b": 0.99}]),
                    ["a", "b"], "a") is None
    # A round with a failed member counts for no one.
    failed = [*runs([{"a": 1.0, "b": 1.05}]),
              {"round": 1, "layout_key": "a", "outcome": "oom"}]
    assert favoured(failed, ["a", "b"], "a") == "b"
