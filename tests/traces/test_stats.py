"""traces.stats: each statistic against its definition (scipy / hand-computed / known processes)."""
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats as st

from llm_replay.traces import Trace, stats
from llm_replay.traces.describe import summarize


def _trace(arr_ns, inp=None, out=None, **cols):
    n = len(arr_ns)
    inp = np.full(n, 10) if inp is None else inp
    out = np.full(n, 5) if out is None else out
    return Trace(pa.table({"arrival_ns": pa.array(arr_ns, pa.int64()), "input_tokens": inp,
                           "output_tokens": out, **cols}))


def _poisson(n=200_000, rate=50.0, seed=1):
    gaps = np.random.default_rng(seed).exponential(1 / rate, n)
    return (np.cumsum(gaps) * 1e9).astype(np.int64)


def test_poisson_process_statistics():
    t = _trace(_poisson())
    assert stats.mean_rate(t) == pytest.approx(50, rel=0.01)
    assert stats.interarrival_cv(t) == pytest.approx(1, abs=0.02)
    idc = stats.index_of_dispersion(t)
    assert set(idc) == {"1s", "10s", "60s"}
    assert idc["1s"] == pytest.approx(1, abs=0.1)
    fits = stats.interarrival_fits(t)
    assert fits["gamma_shape"] == pytest.approx(1, abs=0.02)
    assert fits["weibull_shape"] == pytest.approx(1, abs=0.02)


def test_shape_fits_match_scipy_mle():
    x = np.random.default_rng(3).gamma(0.4, 2.0, 5000)
    assert stats.gamma_shape(x) == pytest.approx(st.gamma.fit(x, floc=0)[0], rel=1e-4)
    y = np.random.default_rng(4).weibull(0.6, 5000) * 3
    assert stats.weibull_shape(y) == pytest.approx(st.weibull_min.fit(y, floc=0)[0], rel=1e-3)
    assert stats.gamma_shape(np.ones(10)) is None and stats.weibull_shape(np.array([1.0])) is None


def test_bursty_trace_has_high_cv_and_dispersion():
    rng = np.random.default_rng(2)
    # on/off: 10 s bursts at 100 req/s separated by 50 s of silence
    bursts = [k * 60 + np.sort(rng.uniform(0, 10, 1000)) for k in range(20)]
    t = _trace((np.concatenate(bursts) * 1e9).astype(np.int64))
    assert stats.interarrival_cv(t) > 3
    idc = stats.index_of_dispersion(t)
    assert idc["10s"] > 50 and idc["1s"] > 5
    assert stats.peak_rate(t, 1.0) > 100
    assert 1000 / 60 <= stats.peak_rate(t, 60.0) < 1100 / 60  # about one burst per minute


def test_peak_rate_needs_a_whole_window():
    t = _trace((np.arange(90) * 1e9 / 3).astype(np.int64))  # 3 req/s for 30 s
    assert stats.peak_rate(t, 60.0) is None  # a partial minute would report 1.5 req/s
    assert stats.peak_rate(t, 10.0) == 3.0


def test_index_of_dispersion_uses_complete_windows_only():
    # arrivals at 0,0,1,2,2,2 s ... counts per 1 s window [2,1,3] and a partial window at 3 s
    a = np.array([0, 0, 1, 2, 2, 2, 3], dtype=np.int64) * 10**9
    idc = stats.index_of_dispersion(_trace(a), windows_s=(1.0, 2.0, 10.0))
    assert idc["1s"] == pytest.approx(np.var([2, 1, 3], ddof=1) / 2)
    assert idc["10s"] is None  # fewer than 2 complete windows
    assert stats.mean_rate(_trace(a)) == pytest.approx(6 / 3)


def test_length_quantiles_and_model_mix():
    n = 1000
    inp = np.arange(1, n + 1)
    out = np.where(np.arange(n) % 10 == 0, None, inp * 2)
    model = np.where(np.arange(n) < 750, "a", "b")
    t = _trace(np.arange(n) * 10**6, inp=inp, out=pa.array(out.tolist(), pa.int64()), model=model)
    q = stats.length_quantiles(t)
    assert q["input_tokens"]["p50"] == pytest.approx(np.percentile(inp, 50))
    assert q["input_tokens"]["max"] == n
    ref_out = [v for v in out if v is not None]
    assert q["output_tokens"]["p99"] == pytest.approx(np.percentile(ref_out, 99))
    assert q["per_model"]["b"]["input_tokens"]["p50"] == pytest.approx(np.percentile(inp[750:], 50))
    assert stats.model_mix(t) == {"a": 0.75, "b": 0.25}
    assert stats.spearman_io(t) == pytest.approx(1.0)


def test_spearman_matches_scipy():
    rng = np.random.default_rng(5)
    inp = rng.integers(1, 4000, 3000)
    out = (inp * rng.uniform(0.1, 2, 3000)).astype(int) + 1
    t = _trace(np.arange(3000) * 10**6, inp=inp, out=out)
    assert stats.spearman_io(t) == pytest.approx(st.spearmanr(inp, out).statistic, rel=1e-9)


def test_prefix_cache_hit_ratio_hand_computed():
    # r0 [1,2,3] all new; r1 [1,2,4]: 2 reused; r2 [5,2]: 2 cached but after a miss -> 0 reused;
    # r3 [1,2,4,4]: 1,2,4 cached, last 4 cached (seen in r1) -> 4 reused
    h = [[1, 2, 3], [1, 2, 4], [5, 2], [1, 2, 4, 4]]
    t = _trace(np.arange(4) * 10**9, inp=[48, 48, 32, 60], hash_ids=pa.array(h, pa.list_(pa.int64())))
    r = stats.prefix_cache_hits(t, block_size=16)
    assert r["blocks"] == 12
    assert r["block_hit_ratio"] == pytest.approx(6 / 12)
    assert r["any_block_hit_ratio"] == pytest.approx(7 / 12)
    assert r["requests_with_hit"] == pytest.approx(2 / 4)
    assert r["token_hit_ratio"] == pytest.approx((32 + 60) / (48 + 48 + 32 + 60))
    # a repeat inside one request is not a hit
    t2 = _trace([0], inp=[32], hash_ids=pa.array([[7, 7]], pa.list_(pa.int64())))
    assert stats.prefix_cache_hits(t2)["block_hit_ratio"] == 0


def test_sessions_and_summary_is_jsonable():
    import json
    sess = ["s1", "s1", "s2", None, "s1"]
    t = _trace(np.arange(5) * 10**9, session_id=sess, turn=pa.array([0, 1, 0, None, 2], pa.int32()))
    s = stats.session_stats(t)
    assert s["sessions"] == 2 and s["max_turn"] == 2
    assert s["requests_per_session"]["max"] == 3
    assert s["multi_turn_share"] == pytest.approx(3 / 5)
    summary = summarize(t)
    json.dumps(summary, allow_nan=False)
    assert summary["requests"] == 5 and summary["prefix_cache"] is None
