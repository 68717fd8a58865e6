"""Percentiles and the order-statistic bootstrap against NumPy and a brute-force bootstrap."""
from __future__ import annotations

import numpy as np
import pytest

from reports.stats import bootstrap_quantiles, describe, grouped_percentiles, quantile_cis


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
    v = rng.normal(100, 10, 5000)
    v[::7] = np.nan
    codes = rng.integers(0, 4, 5000)
    for key_sort_min in (0, 10**9):      # composite-key sort and per-group sorts
        counts, pct = grouped_percentiles(v, codes, 5, [50, 99], key_sort_min=key_sort_min)
        for g in range(4):
            sel = v[(codes == g) & ~np.isnan(v)]
            assert counts[g] == len(sel)
            assert pct[g] == pytest.approx(np.percentile(sel, [50, 99]), rel=1e-12)
        assert counts[4] == 0 and np.isnan(pct[4]).all()
