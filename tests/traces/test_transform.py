"""Transforms: exact arithmetic, composition, metadata record, and their error messages."""
import numpy as np
import pyarrow as pa
import pytest

from llm_replay.traces import Trace, TraceError
from llm_replay.traces import transform as tf


def _t(arr, **cols):
    n = len(arr)
    base = {"arrival_ns": pa.array(arr, pa.int64()), "input_tokens": cols.pop("input_tokens", [100] * n),
            "output_tokens": cols.pop("output_tokens", [10] * n)}
    return Trace(pa.table({**base, **cols}))


def test_speed_is_exact_and_recorded():
    t = tf.speed(_t([0, 3, 10**18 + 7]), 3)
    assert t.table.column("arrival_ns").to_pylist() == [0, 1, 333_333_333_333_333_336]
    assert t.metadata["transforms"] == [{"op": "speed", "factor": 3}]
    assert tf.speed(_t([0, 10**9]), 0.5).table.column("arrival_ns").to_pylist() == [0, 2 * 10**9]
    with pytest.raises(TraceError, match="speed factor must be > 0"):
        tf.speed(_t([0]), 0)


def test_rate_rescale_hits_target():
    a = np.cumsum(np.random.default_rng(0).exponential(0.5e9, 1000)).astype(np.int64)
    t = tf.rate(_t(a), 10.0)
    n, d = t.num_rows, t.table.column("arrival_ns")[-1].as_py() - t.table.column("arrival_ns")[0].as_py()
    assert (n - 1) / (d / 1e9) == pytest.approx(10.0, rel=1e-6)
    assert t.metadata["transforms"][0]["op"] == "rate"


def test_slice_head_sample_filter_map_compose():
    t = _t(list(range(0, 10 * 10**9, 10**9)), model=["a", "b"] * 5, client_id=["x"] * 5 + ["y"] * 5)
    s = tf.time_slice(t, 2, 8)
    assert s.table.column("arrival_ns").to_pylist() == [i * 10**9 for i in range(6)]
    s = tf.filter_values(s, "model", ["a"])
    assert s.table.column("model").to_pylist() == ["a"] * 3
    s = tf.map_model(s, {"a": "llama"})
    assert s.table.column("model").to_pylist() == ["llama"] * 3
    assert [x["op"] for x in s.metadata["transforms"]] == ["slice", "filter_model", "map_model"]
    assert tf.head(t, 4).num_rows == 4
    s1, s2 = tf.sample(t, 0.5, seed=1), tf.sample(t, 0.5, seed=1)
    assert s1.table.equals(s2.table) and 0 < s1.num_rows < 10
    with pytest.raises(TraceError, match="left no requests"):
        tf.filter_values(t, "client_id", ["nobody"])


def test_merge_superposes_and_deduplicates_ids():
    a = _t([0, 2, 4], model=["a"] * 3)
    b = _t([1, 3], model=["b"] * 2)
    m = tf.merge(a, b, "other")
    assert m.table.column("arrival_ns").to_pylist() == [0, 1, 2, 3, 4]
    assert m.table.column("request_id").to_pylist() == ["0", "other:0", "1", "other:1", "2"]
    assert m.table.column("model").to_pylist() == ["a", "b", "a", "b", "a"]


def test_shift_clip_and_hash_ids_truncation():
    h = pa.array([[1, 2, 3], [4], None], pa.list_(pa.int64()))
    t = Trace(pa.table({"arrival_ns": pa.array([0, 5, 9], pa.int64()), "input_tokens": [48, 10, 40],
                        "output_tokens": [1, 2000, 3], "hash_ids": h}), {"block_size": 16})
    c = tf.clip(t, "input_tokens", None, 20)
    assert c.table.column("input_tokens").to_pylist() == [20, 10, 20]
    assert c.table.column("hash_ids").to_pylist() == [[1, 2], [4], None]
    c = tf.clip(c, "output_tokens", 2, 100)
    assert c.table.column("output_tokens").to_pylist() == [2, 100, 3]
    assert tf.shift(t, 1.5).table.column("arrival_ns").to_pylist() == [1_500_000_000, 1_500_000_005, 1_500_000_009]
    with pytest.raises(TraceError, match="negative"):
        tf.shift(t, -1)


def test_dequantize_spreads_ties_evenly():
    t = tf.dequantize(_t([0, 0, 0, 0, 10**9, 2 * 10**9, 2 * 10**9]))
    assert t.table.column("arrival_ns").to_pylist() == [0, 250_000_000, 500_000_000, 750_000_000,
                                                         10**9, 2 * 10**9, 2_500_000_000]


def test_block_rule_checked_on_read():
    h = pa.array([[1, 2, 3]], pa.list_(pa.int64()))
    with pytest.raises(TraceError, match=r"more blocks than ceil\(input_tokens / 16\) allows: rows 0"):
        Trace(pa.table({"arrival_ns": [0], "input_tokens": [32], "output_tokens": [1], "hash_ids": h}),
              {"block_size": 16})


def _buckets(jitter_ms, per_bucket, n_buckets=200, seed=0, quantum_ms=3000):
    """Mooncake-like ms timestamps: `per_bucket(rng)` requests per 3 s bucket, each up to
    `jitter_ms` after the bucket start."""
    rng = np.random.default_rng(seed)
    ms = [k * quantum_ms + int(rng.integers(0, jitter_ms + 1))
          for k in range(n_buckets) for _ in range(per_bucket(rng))]
    return _t(np.sort(np.array(ms, np.int64)) * 10**6)


def test_bucket_detection_finds_jittered_buckets():
    """~3 s buckets whose ms timestamps jitter by a few ms are found (not the 1 ms resolution),
    and dequantize spreads each bucket over 3 s, in order (issue 16 item 9)."""
    from llm_replay.traces.stats import timestamp_buckets
    t = _buckets(3, lambda r: 1 + r.poisson(6))
    b = timestamp_buckets(t.table)
    assert b["quantum_ns"] == 3 * 10**9 and b["jitter_ns"] <= 3 * 10**6 and b["tied_share"] > 0.8
    d = tf.dequantize(t)
    op = d.metadata["transforms"][-1]
    assert op["quantum_ns"] == 3 * 10**9 and op["quantum_from"] == "buckets" and op["spread"] > 0.8 * t.num_rows
    a = d.table.column("arrival_ns").to_numpy()
    assert (np.diff(a) >= 0).all() and np.diff(a).max() < 3 * 10**9 and (np.diff(a) == 0).mean() < 0.01
    assert "3000 ms buckets (ties within" in tf.dequantize_message(op)
    # exact buckets (no jitter), with empty buckets between some of them
    assert timestamp_buckets(_buckets(0, lambda r: r.poisson(3)).table)["quantum_ns"] == 3 * 10**9
    # Poisson arrivals in ms are not bucketed: dequantize says so and falls back to the resolution
    rng = np.random.default_rng(1)
    poisson = _t(np.cumsum(rng.exponential(200, 2000)).astype(np.int64) * 10**6)
    assert timestamp_buckets(poisson.table) is None
    op = tf.dequantize(poisson).metadata["transforms"][-1]
    assert op["quantum_from"] == "resolution" and op["quantum_ns"] == 10**6
    assert tf.dequantize_message(op).startswith("dequantize: no bucketed timestamps found")
