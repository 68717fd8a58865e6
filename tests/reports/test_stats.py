"""Percentiles and the order-statistic bootstrap against NumPy and a brute-force bootstrap."""
from __future__ import annotations

import numpy as np
import pytest

from llm_replay.reports.stats import (bootstrap_quantiles, describe, grouped_percentiles, order_statistics,
                           quantile_cis, regrouped_percentiles)


def test_describe_matches_numpy_linear_and_warns_on_thin_tails():
    x = np.random.default_rng(1).lognormal(0, 1, 1234)
    d = describe(np.concatenate([x, [np.nan, np.nan]]))   # NaN (failed requests) are ignored
    assert d["n"] == 1234
    for k, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("p99.9", 99.9)):
        assert d[k] == pytest.approx(np.percentile(x, q, method="linear"))
    assert d["max"] == x.max() and d["mean"] == pytest.approx(x.mean())
    assert d["ci"]["p95"][0] < d["p95"] < d["ci"]["p95"][1]
    assert d["thin"] == ["p99.9"]                         # 1234 * 0.001 < 10
    assert describe(x[:500])["thin"] == ["p99", "p99.9"]  # 500 * 0.01 = 5 < 10
    assert describe(np.array([]))["n"] == 0 and describe(np.array([]))["p99"] is None


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_order_statistics_equal_sorting(dtype):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.lognormal(2, 2, 50_000), np.zeros(7), np.round(rng.lognormal(2, 1, 5000))]).astype(dtype)
    ranks = np.unique(np.concatenate([rng.integers(0, len(x), 300), [0, 1, len(x) - 1]]))
    assert np.array_equal(order_statistics(x, ranks), np.sort(x)[ranks])
    neg = x - 1
    assert np.array_equal(order_statistics(neg, ranks), np.sort(neg)[ranks])


def test_describe_selection_equals_numpy_on_large_samples():
    x = np.random.default_rng(9).gamma(1.5, 40.0, 300_000)     # above the selection threshold
    x[::13] = np.nan                                           # failed requests
    x[5] = -0.0
    d = describe(x)
    clean = x[~np.isnan(x)]
    assert d["n"] == len(clean) and d["mean"] == pytest.approx(clean.mean(), rel=1e-12)
    assert [d[k] for k in ("p50", "p90", "p95", "p99", "p99.9", "max")] == \
        np.percentile(clean, [50, 90, 95, 99, 99.9, 100]).tolist()


def test_grouped_selection_of_float32_negatives_and_nan():
    rng = np.random.default_rng(2)
    x = rng.lognormal(1, 2, 20_000).astype(np.float32)
    x[::3] *= -1                           # negative values: their bits order backwards
    x[::5] = np.nan
    x[1], x[2] = -0.0, 0.0
    codes = rng.integers(0, 3, 20_000)
    qs = [0, 0.1, 50, 99.9, 100]
    counts, pct = grouped_percentiles(x, codes, 4, qs)
    groups = [x[(codes == g) & ~np.isnan(x)] for g in range(3)]
    assert counts.tolist() == [len(g) for g in groups] + [0]
    for g in range(3):
        assert pct[g].tolist() == np.percentile(groups[g], qs).tolist()
    assert np.isnan(pct[3]).all()


def test_exact_bootstrap_matches_brute_force_resampling():
    rng = np.random.default_rng(7)
    x = rng.gamma(2.0, 50.0, 400)
    fast = bootstrap_quantiles(x, [50, 95, 99], n_boot=20000, seed=3)
    idx = rng.integers(0, len(x), size=(20000, len(x)))
    brute = np.percentile(x[idx], [50, 95, 99], axis=1)
    for f, b in zip(fast, brute):   # same bootstrap distribution: its quantiles agree
        qs = [0.025, 0.25, 0.5, 0.75, 0.975]
        assert np.quantile(f, qs) == pytest.approx(np.quantile(b, qs), rel=0.03)


def test_ci_covers_the_true_quantile_most_of_the_time():
    rng = np.random.default_rng(11)
    true_p95 = -np.log(0.05)                  # exponential(1)
    hits = sum(lo <= true_p95 <= hi for lo, hi in
               (quantile_cis(rng.exponential(1.0, 2000), [95], seed=s)[0] for s in range(60)))
    assert 50 <= hits <= 60                   # nominal 95%: ~57 of 60


def test_grouped_percentiles_match_per_group_numpy():
    rng = np.random.default_rng(5)
    v = rng.lognormal(3, 1.5, 5000)
    v[::7] = np.nan
    codes = rng.integers(0, 4, 5000)
    v[::11] = np.round(v[::11])           # ties
    v[3] = 0.0
    qs = [0, 0.1, 50, 90, 95, 99, 99.9, 100]
    counts, pct = grouped_percentiles(v, codes, 5, qs)
    for g in range(4):
        sel = v[(codes == g) & ~np.isnan(v)]
        assert counts[g] == len(sel)
        assert pct[g] == pytest.approx(np.percentile(sel, qs), rel=0, abs=0)
    assert counts[4] == 0 and np.isnan(pct[4]).all()
    one = grouped_percentiles(np.array([5.0, 7.0, np.nan]), np.array([1, 1, 0]), 2, [50])
    assert one[0].tolist() == [0, 2] and np.isnan(one[1][0, 0]) and one[1][1, 0] == 6.0


def test_regrouped_percentiles_equal_each_grouping_alone():
    rng = np.random.default_rng(6)
    v = rng.lognormal(3, 1.5, 8000)
    v[::9] = np.nan
    v[::13] = np.round(v[::13])            # ties
    a, b = rng.integers(0, 3, 8000), rng.integers(0, 4, 8000)
    cells = a * 5 + b                       # 15 cells, b never 4: empty groups and cells
    cell = np.arange(15)
    groupings = [(cell // 5, 3), (cell % 5, 5), (np.zeros(15, dtype=np.int64), 1)]
    qs = [0, 50, 90, 99, 100]
    got = regrouped_percentiles(v, cells, 15, groupings, qs)
    for (to, ng), (counts, pct) in zip(groupings, got):
        want_counts, want_pct = grouped_percentiles(v, to[cells], ng, qs)
        assert counts.tolist() == want_counts.tolist()
        assert np.array_equal(pct, want_pct, equal_nan=True)
        for g in range(ng):                 # and each group equals NumPy on its own values
            sel = v[(to[cells] == g) & ~np.isnan(v)]
            assert counts[g] == len(sel)
            assert pct[g].tolist() == np.percentile(sel, qs).tolist() if len(sel) else np.isnan(pct[g]).all()
