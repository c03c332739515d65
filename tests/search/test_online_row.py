"""The online-calibrated row of ``benchmarks/cost_model_accuracy.py`` (issue #13, part 5):
the default strategy, replayed as a study, ranks the layouts it has not tried with what it
learned from its first ``k`` trials, and from nothing else."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from autotune.landscape import LandscapeGroup, Measurement
from autotune.layout import Layout
from autotune.search import Observation, ResidualStrategy, cost_model_predictor, plan_order
from benchmarks import _online as online
from benchmarks._common import study_check
from tests.search.conftest import synthetic_group


def _predict(group: LandscapeGroup):
    return cost_model_predictor(group.model, group.cluster, dtype=group.dtype)


def _with_value(group: LandscapeGroup, layout: Layout, value: float) -> LandscapeGroup:
    """``group`` with ``layout``'s measured throughput set to ``value``."""
    rows = tuple(Measurement(m.layout, m.status, value, m.iteration_time_s)
                 if m.layout == layout else m for m in group.measurements)
    return replace(group, measurements=rows)


def _snapshot(group: LandscapeGroup, k: int) -> online.Snapshot:
    [snap] = online.snapshots(group, study_check(group), [k], _predict(group))
    return snap


@pytest.mark.parametrize("oom_mb", [None, 4], ids=["all-ok", "with-ooms"])
def test_only_the_first_k_trials_reach_the_calibrated_ranking(oom_mb: int | None) -> None:
    group = synthetic_group(oom_mb=oom_mb)
    snap = _snapshot(group, 2)
    assert snap.after == 2 and len(snap.measured) == 2
    assert len(snap.untried) == len(snap.calibrated) > 3
    assert not {o.layout for o in snap.measured} & set(snap.untried)
    # The layout the strategy measures next (its 3rd trial) and the last untried one: the
    # table's values of layouts not yet measured never reach the ranking after 2 trials.
    third = _snapshot(group, 3).measured[2].layout
    for lay in {third, snap.untried[-1]}:
        for value in (1e-3, 1e6):
            other = _snapshot(_with_value(group, lay, value), 2)
            assert other.measured == snap.measured and other.untried == snap.untried
            assert other.calibrated == snap.calibrated
    # ...while a value it did measure moves it (the calibration is online, not the prior).
    first = snap.measured[0].layout
    moved = _snapshot(_with_value(group, first, 3.0 * snap.measured[0].value), 2)
    assert moved.measured[0].layout == first
    assert not np.allclose(moved.calibrated, snap.calibrated)


def test_the_calibrated_model_is_the_strategys_posterior() -> None:
    group = synthetic_group()
    predict = _predict(group)
    cands = plan_order(group.layouts())
    strategy = ResidualStrategy(predict=predict)
    prior, _ = strategy.posterior(cands, [], cands)
    assert np.allclose(prior, [math.log(predict(lay)) for lay in cands])  # nothing learned
    # Every measurement 2x the prediction: the posterior of the others rises towards it
    # (shrunk by the prior; the per-axis trends spread it).
    history = [Observation(lay, "ok", 2.0 * predict(lay)) for lay in cands[:3]]
    mean, sd = strategy.posterior(cands, history, cands[3:])
    assert np.all(mean > prior[3:]) and 0.0 < np.median(mean - prior[3:]) < math.log(2.0)
    assert np.all(sd > 0)


def test_score_puts_both_rankings_on_the_same_untried_layouts() -> None:
    group = synthetic_group()
    predict = _predict(group)
    snap = _snapshot(group, 2)
    row = online.score(snap, group, predict)
    assert row["after"] == 2 and row["n_untried"] == len(snap.untried)
    assert row["measured"] == [o.layout.key() for o in snap.measured]
    for key in ("spearman", "analytic_spearman"):
        assert row[key] is None or -1.0 <= row[key] <= 1.0
    best = group.best().layout
    assert row["best_measured"] == (best in {o.layout for o in snap.measured})
    if row["best_measured"]:
        assert row["best_in_top3"] and row["analytic_best_in_top3"]
    # A calibrated ranking that is the measured order itself: rho 1, best ranked first.
    value = {m.layout: m.model_tflops_per_device for m in group.ok()}
    perfect = replace(snap, calibrated=tuple(math.log(value[lay]) for lay in snap.untried))
    ideal = online.score(perfect, group, predict)
    assert ideal["spearman"] == pytest.approx(1.0) and ideal["best_in_top3"]


def test_a_count_beyond_the_candidates_is_not_reached() -> None:
    group = synthetic_group()
    n = len(group.layouts())
    assert [s.after for s in online.snapshots(group, study_check(group), [2, n + 1],
                                              _predict(group))] == [2]


def test_parse_after() -> None:
    assert online.parse_after("4,2, 2") == [2, 4] and online.parse_after("") == []
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="--online-after"):
            online.parse_after(bad)


def test_the_benchmark_reports_the_online_row_beside_the_old_keys(accuracy, tmp_path,
                                                                  capsys) -> None:
    from tests.search.test_harness import _vtrain_csv

    csv, rows = _vtrain_csv(tmp_path)
    out = tmp_path / "acc.json"
    assert accuracy.main(["--landscape", str(csv), "--online-after", "2,4",
                          "--json", str(out)]) == 0
    assert "online-calibrated cost model" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert {"median_spearman", "groups", "ok_rows", "ok_excluded"} <= set(doc)  # unchanged
    on = doc["online"]
    assert set(on["after"]) == {"2", "4"} and "k trials" in on["definition"]
    for summary in on["after"].values():
        assert {"median_spearman", "best_in_top3",
                "analytic_median_spearman_same_layouts",
                "analytic_best_in_top3_same_layouts", "n_groups"} <= set(summary)
        assert summary["n_groups"] == 1
    [g] = on["groups"]
    assert g["n_layouts"] == len(rows) and g["after"]["4"]["n_untried"] == len(rows) - 4
    # No counts: no online row, the rest as before.
    assert accuracy.main(["--landscape", str(csv), "--online-after", "",
                          "--json", str(out)]) == 0
    assert "online" not in json.loads(out.read_text())
    with pytest.raises(SystemExit):
        accuracy.main(["--landscape", str(csv), "--online-after", "x"])


def _direct_posterior(strategy: ResidualStrategy, history: list[Observation],
                      free: list[Layout]) -> tuple[np.ndarray, np.ndarray]:
    """The posterior of ``free`` by the n x n formulas (n trials) the strategy used before
    issue #23 moved them into the coefficients' space: the reference they must equal."""
    from autotune.models.evidence import SHAPE_SCALES
    from autotune.search._residual import LAYOUT_SD

    feats = strategy._features
    assert feats is not None
    ok = [o for o in history if o.status == "ok"]
    x = feats.matrix([o.layout for o in ok])
    r = np.array([math.log(o.value) - strategy._prior[o.layout] for o in ok])
    cov, coef, n = np.linalg.inv(strategy._prior_precision), strategy._prior_mean, len(ok)
    best, best_ml = 1.0, -math.inf
    for a in SHAPE_SCALES:
        d = np.where(feats.shape, a, 1.0)
        c = (x * d) @ cov @ (x * d).T + LAYOUT_SD**2 * np.eye(n)
        resid = r - (x * d) @ coef
        ml = -0.5 * (resid @ np.linalg.solve(c, resid) + np.linalg.slogdet(c)[1])
        if ml > best_ml + 1e-9:
            best, best_ml = a, ml
    d = np.where(feats.shape, best, 1.0)
    cov, coef = d[:, None] * cov * d[None, :], d * coef
    gain = cov @ x.T @ np.linalg.inv(x @ cov @ x.T + LAYOUT_SD**2 * np.eye(n))
    coef, cov = coef + gain @ (r - x @ coef), cov - gain @ x @ cov
    x_free = feats.matrix(free)
    mean = np.array([strategy._prior[lay] for lay in free]) + x_free @ coef
    var = np.einsum("ij,jk,ik->i", x_free, cov, x_free) + LAYOUT_SD**2
    return mean, np.sqrt(np.maximum(var, LAYOUT_SD**2))


@pytest.mark.parametrize("n", [2, 5, 12])
def test_the_posterior_in_the_coefficients_space_is_the_direct_one(n: int) -> None:
    group = synthetic_group()
    predict = _predict(group)
    cands = plan_order(group.layouts())
    rng = np.random.default_rng(n)
    history = [Observation(lay, "ok", predict(lay) * math.exp(rng.normal(0, 0.4)))
               for lay in cands[:n]]
    strategy = ResidualStrategy(predict=predict)
    mean, sd = strategy.posterior(cands, history, cands[n:])
    ref_mean, ref_sd = _direct_posterior(strategy, history, cands[n:])
    assert np.allclose(mean, ref_mean, atol=1e-8) and np.allclose(sd, ref_sd, atol=1e-8)
