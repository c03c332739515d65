"""The benchmark harness: random search matches its analytic expectation."""

from __future__ import annotations

import json
import statistics

from autotune.search import make_strategy
from benchmarks._search_replays import (
    good_count,
    random_expectation,
    random_success_probability,
    trials_to_hit,
)
from tests.search.conftest import synthetic_group


def test_random_matches_the_analytic_expectation():
    group = synthetic_group(n_good=3)
    n, k = len(group.measurements), good_count(group, 0.02)
    assert k == 3
    trials = [trials_to_hit(make_strategy("random", seed=s), group, 0.02)
              for s in range(400)]
    expected = random_expectation(n, k)  # (N+1)/(k+1)
    # Sd of one draw is below N/2; the mean of 400 is within ~4 sd of noise.
    assert abs(statistics.fmean(trials) - expected) < 4 * (n / 2) / 20
    p = random_success_probability(n, k, 5)
    hit = sum(t <= 5 for t in trials) / len(trials)
    assert abs(hit - p) < 0.1


def _vtrain_csv(tmp_path):
    """A small landscape in the vTrain column format: one group of 4 GPUs, batch 8."""
    csv = tmp_path / "l.csv"
    header = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
              "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
              "iteration time (ms)\n")
    rows = []
    for tp, pp in ((1, 1), (1, 2), (2, 1), (1, 4), (4, 1), (2, 2)):
        dp = 4 // (tp * pp)
        for mb in (1, 2, 4, 8):
            if 8 % (dp * mb) == 0:
                rows.append(f"4,8,{mb},1024,16,8,1024,{tp},{dp},{pp},{100 + 10 * tp + pp + mb}")
    csv.write_text(header + "\n".join(rows) + "\n")
    return csv, rows


def test_main_writes_the_contract_json(bench, tmp_path):
    csv, rows = _vtrain_csv(tmp_path)
    out = tmp_path / "o.json"
    bench.main(["--landscape", str(csv), "--strategies", "default,random,grid",
                "--repeats", "5", "--jobs", "1", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["tolerance"] == 0.02 and doc["budget"] == 10
    assert set(doc["strategies"]) == {"default", "random", "grid"}
    for s in doc["strategies"].values():
        assert {"median_trials", "success_rate"} <= set(s)
    [g] = doc["groups"]
    assert g["n_layouts"] == len(rows) and "median_trials" in g["strategies"]["default"]


def test_early_stop_extends_the_json_without_changing_it(bench, tmp_path):
    csv, _ = _vtrain_csv(tmp_path)
    plain, early = tmp_path / "plain.json", tmp_path / "early.json"
    common = ["--landscape", str(csv), "--strategies", "default", "--jobs", "1"]
    bench.main([*common, "--json", str(plain)])
    bench.main([*common, "--min-improvement", "0.5", "--min-improvement", "0.01",
                "--json", str(early)])
    before, after = json.loads(plain.read_text()), json.loads(early.read_text())
    assert after["strategies"] == before["strategies"]  # the contract keys are untouched
    rows = {r["min_improvement"]: r for r in after["early_stop"]}
    assert set(rows) == {None, 0.01, 0.5}  # None: the same strategy without the stop
    for r in rows.values():
        assert {"mean_trials", "median_trials", "max_trials", "stopped_rate", "success_rate",
                "mean_regret", "max_regret"} <= set(r)
    assert rows[None]["stopped_rate"] == 0.0 and rows[None]["mean_trials"] == 10
    assert rows[0.5]["stopped_rate"] == 1.0 and rows[0.5]["mean_trials"] == 4  # the seeds
    [g] = after["groups"]
    assert {r["min_improvement"] for r in g["early_stop"]} == {None, 0.01, 0.5}
    for r in g["early_stop"]:
        assert 0.0 <= r["regret"] < 1.0 and isinstance(r["success"], bool)


def test_max_trials_censors_a_late_hit_as_a_miss():
    group = synthetic_group(n_good=1)
    # Grid order is deterministic: find where it hits, then censor one trial earlier.
    hit = trials_to_hit(make_strategy("grid", seed=0), group, 0.02)
    assert hit is not None and hit > 1
    assert trials_to_hit(make_strategy("grid", seed=0), group, 0.02, hit) == hit
    assert trials_to_hit(make_strategy("grid", seed=0), group, 0.02, hit - 1) is None
