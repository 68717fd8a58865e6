"""Prefix reuse and sessions (issue 14): reuse distances, conversations from session_id or
from hash_ids chains, fit -> generate reproducing them, and the compare rows and QQ plot."""
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import run_cli
from llm_replay.traces import Trace, prefixes, stats
from llm_replay.traces.compare import compare_traces, format_table
from llm_replay.traces.fit import fit_trace
from llm_replay.traces.generate import generate

MOONCAKE = Path(__file__).parent / "fixtures" / "public" / "mooncake_conversation_trace.jsonl"


def _table(hash_ids, inp=None, sessions=None, gap_s=1.0):
    n = len(hash_ids)
    cols = {"arrival_ns": (np.arange(n) * gap_s * 1e9).astype(np.int64),
            "input_tokens": np.array(inp or [16 * len(h) for h in hash_ids], np.int32),
            "output_tokens": np.full(n, 10, np.int32), "hash_ids": pa.array(hash_ids, pa.list_(pa.int64()))}
    if sessions:
        cols["session_id"] = sessions
    return pa.table(cols)


def test_reuse_distances_count_requests_since_last_use():
    # 0 is a shared system block; 1-2 one conversation (rows 0, 2, 4); 7 and 8 others
    t = _table([[0, 1, 2], [0, 7], [0, 1, 2, 3], [0, 8], [0, 1, 2, 3, 4]])
    r = prefixes.reuse_distances(t)
    # hits: row1 0 (1); row2 0 (1), 1, 2 (2 each); row3 0 (1); row4 0 (1), 1, 2, 3 (2 each)
    d = np.array([1, 1, 2, 2, 1, 1, 2, 2, 2])
    assert r["unit"] == "requests" and r["hits"] == len(d) == stats.prefix_cache_hits(t)["blocks"] * \
        stats.prefix_cache_hits(t)["block_hit_ratio"]
    assert r["requests"]["p50"] == np.percentile(d, 50) and r["requests"]["mean"] == pytest.approx(d.mean())
    assert r["seconds"]["max"] == 2.0
    assert prefixes.reuse_distances(_table([[1], [2]])) is None


def test_conversations_from_hash_chains_ignore_shared_prefixes():
    # block 0 is followed by 1, 7, 8, 9, 5: shared (fan-out 5 > MAX_FANOUT), so rows that only
    # share it are not turns of one conversation; row 2 continues row 0, row 5 row 2
    t = _table([[0, 1, 2], [0, 7], [0, 1, 2, 3], [0, 8], [0, 9], [0, 1, 2, 3, 4], [0, 5]])
    assert prefixes.prefix_parents(t).tolist() == [-1, -1, 0, -1, -1, 2, -1]
    s = prefixes.turn_stats(t)
    assert s["source"] == "hash_ids" and s["sessions"] == 5
    assert s["turns"]["mean"] == pytest.approx(7 / 5) and s["turns"]["max"] == 3
    assert s["gap_s"]["p50"] == 2.5 and s["growth"]["p50"] == 16.0 and s["new_tokens"]["p50"] == 6.0
    # with session_id the sessions are taken as given (and hash_ids chains on request)
    sid = ["a", "b", "a", "c", "d", "a", "e"]
    assert prefixes.turn_stats(_table([[0]] * 7, sessions=sid))["turns"]["max"] == 3
    distinct = _table([[i] for i in range(7)], sessions=sid)
    assert prefixes.turn_stats(distinct, source="hash_ids")["turns"]["max"] == 1


def test_count_quantile_moves_smoothly():
    assert stats.count_quantile(np.array([1] * 90 + [3] * 10), 0.45) == pytest.approx(1.0)
    assert stats.count_quantile(np.array([1] * 90 + [3] * 10), 0.95) == pytest.approx(3.0)
    assert stats.count_quantile(np.array([1] * 80 + [3] * 20), 0.9) == pytest.approx(3.0)
    assert stats.count_quantile(np.array([2, 2, 2, 2]), 0.5) == pytest.approx(2.0)


def _conversations(seed=0, duration=7200):
    """A known reuse structure: multi-turn chat with a 2-block system prompt on 90 % of the
    sessions (Zipf turns, ~40 s think time), 64-token blocks."""
    return generate({"duration": duration, "block_size": 64, "clients": [{
        "name": "chat", "rate": 3.0, "arrival": {"process": "poisson"},
        "input": {"dist": "lognormal", "median": 600, "sigma": 0.8, "max": 20000},
        "output": {"dist": "lognormal", "median": 200, "sigma": 0.6, "max": 2000},
        "sessions": {"turns": {"dist": "zipf", "a": 1.8, "max": 12},
                     "think_s": {"dist": "lognormal", "median": 40, "sigma": 0.6},
                     "user_tokens": {"dist": "lognormal", "median": 80, "sigma": 0.7}},
        "prefix": {"system_blocks": 2, "system_share": 0.9}}]}, seed=seed)


def _rows(a, b):
    return {r["metric"]: r for r in compare_traces(a, b)}


REUSE_ROWS = ("prefix_block_hit_ratio", "reuse_distance_requests.p50", "reuse_distance_requests.p90",
              "turns_per_session.mean", "turns_per_session.p90", "turn_gap_s.p50")


@pytest.mark.slow
@pytest.mark.parametrize("strip", [False, True])
def test_known_reuse_structure_is_fitted_and_regenerated(strip):
    """With session_id, and with it removed (conversations then come from hash_ids chains,
    as for Mooncake): fit -> generate(another seed) -> compare passes every reuse row."""
    src = _conversations()
    if strip:
        src = Trace(src.table.drop_columns(["session_id", "turn", "parent_id"]), src.metadata)
    spec = fit_trace(src)
    c = spec["clients"][0]
    assert "sessions" in c and c["prefix"]["system_blocks"] == 2
    assert c["prefix"]["system_share"] == pytest.approx(0.9, abs=0.03) and "apps" not in c["prefix"]
    rows = _rows(src, generate(spec, seed=1))
    bad = [rows[m] for m in REUSE_ROWS if rows[m]["verdict"] != "pass"]
    assert not bad, format_table(list(rows.values()))
    assert rows["prefix_block_hit_ratio"]["a"] > 0.4


def test_compare_fails_on_a_different_hit_ratio_or_turns():
    a = _conversations(duration=3600)
    spec = json.loads(json.dumps(a.metadata["generator"]["spec"]))
    spec["clients"][0]["prefix"]["system_blocks"] = 12          # a longer shared system prompt
    b = generate(spec, seed=1)
    hit_a, hit_b = (stats.prefix_cache_hits(x)["block_hit_ratio"] for x in (a, b))
    assert 0.08 < hit_b - hit_a < 0.2
    assert _rows(a, b)["prefix_block_hit_ratio"]["verdict"] == "fail"
    spec["clients"][0]["prefix"]["system_blocks"] = 2
    spec["clients"][0]["sessions"]["turns"] = {"dist": "constant", "value": 1}
    v = _rows(a, generate(spec, seed=1))
    assert v["turns_per_session.mean"]["verdict"] == "fail" and v["prefix_block_hit_ratio"]["verdict"] == "fail"


def test_idc_600s_needs_long_traces():
    short = _conversations(duration=2000)
    row = _rows(short, short)["idc_600s"]
    assert row["verdict"] == "not judged" and row["reason"] == "only 3 windows" and "NOT JUDGED" in format_table([row])
    hour = _rows(_conversations(duration=3600), _conversations(duration=3600))["idc_600s"]
    assert hour["a"] is not None and hour["verdict"] == "not judged"     # 6 windows: shown, not judged
    t = generate({"duration": 14000, "clients": [{"rate": 2, "input": {"dist": "constant", "value": 5},
                                                  "output": {"dist": "constant", "value": 5}}]}, seed=2)
    bursty = generate({"duration": 14000, "clients": [{"rate": 2, "arrival": {"process": "gamma", "cv": 4},
                                                       "input": {"dist": "constant", "value": 5},
                                                       "output": {"dist": "constant", "value": 5}}]}, seed=2)
    assert _rows(t, t)["idc_600s"]["verdict"] == "pass" and _rows(t, bursty)["idc_600s"]["verdict"] == "fail"


def test_html_has_the_rows_and_a_qq_plot_inside_its_frame(tmp_path):
    a, b, out = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "cmp.html"
    _conversations(duration=3600).write(a)
    _conversations(seed=1, duration=3600).write(b)
    p = run_cli("replay", "trace", "compare", a, b, "--html", out)
    assert p.returncode in (0, 1) and "turns_per_session.mean" in p.stdout
    page = out.read_text()
    assert "<script" not in page and "turns_per_session.p90" in page and "reuse_distance_requests.p50" in page
    frame = re.search(r'<rect class="frame" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', page)
    x0, y0, w, h = map(float, frame.groups())
    pts = [(float(x), float(y)) for x, y in re.findall(r'<circle class="pt" cx="([\d.]+)" cy="([\d.]+)"', page)]
    assert len(pts) > 90
    assert all(x0 <= x <= x0 + w and y0 <= y <= y0 + h for x, y in pts)
    # the same spec: the points follow the diagonal (within a factor 1.5 from p1 to p99)
    xs, ys = np.array(pts).T
    assert np.abs((xs - x0) - (y0 + h - ys))[2:-2].max() < np.log10(1.5) / 1 * w


@pytest.mark.slow
@pytest.mark.skipif(not MOONCAKE.exists(), reason="public Mooncake fixture not present")
def test_mooncake_conversation_round_trip_keeps_reuse_and_turns(tmp_path):
    """Mooncake's conversation trace has no session ids: fit infers conversations from the
    hash_ids chains; generate(seed 1) -> compare passes the prefix-hit, reuse and turns rows."""
    t, spec, gen = tmp_path / "m.parquet", tmp_path / "m.yaml", tmp_path / "g.parquet"
    run_cli("replay", "trace", "import", "mooncake", MOONCAKE, "-o", t, check=True)
    run_cli("replay", "trace", "fit", t, "-o", spec, check=True)
    run_cli("replay", "trace", "generate", "--spec", spec, "--seed", "1", "-o", gen, check=True)
    rows = {r["metric"]: r for r in json.loads(run_cli("replay", "trace", "compare", t, gen, "--json").stdout)}
    assert rows["prefix_block_hit_ratio"]["a"] == pytest.approx(0.366, abs=0.001)
    bad = [rows[m] for m in REUSE_ROWS if rows[m]["verdict"] != "pass"]
    assert not bad, bad
