"""Shared application prefixes (issue 25 item 3): a pool of prefixes with their own lengths and
popularity, apart from conversations; fit learns it, generate realises it, describe and
compare report it; branched conversations; describe and compare agree on turns."""
import json

import numpy as np
import pyarrow as pa
import pytest
import yaml

from tests.conftest import run_cli
from llm_replay.traces import Trace, prefixes, stats
from llm_replay.traces import fit as fit_mod
from llm_replay.traces.compare import compare_traces, format_table
from llm_replay.traces.fit import fit_trace
from llm_replay.traces.generate import generate
from llm_replay.traces.importers import import_trace
from llm_replay.traces.spec import SpecError, parse_spec

from .test_prefix_sessions import MOONCAKE

APPS = MOONCAKE.parent / "mooncake_arxiv_window.jsonl"
BLOCKS = [40, 3, 25, 8, 60, 12, 5, 30, 18, 2]          # each prefix's length, most popular first
ZIPF = 1.1


def _client(**over):
    c = {"name": "api", "rate": 15.0, "exact_count": True,
         "input": {"dist": "lognormal", "median": 400, "sigma": 0.6, "max": 8000},
         "output": {"dist": "lognormal", "median": 80, "sigma": 0.5, "max": 1000},
         "prefix": {"system_blocks": 2, "system_share": 0.3,
                    "pool": {"share": 0.6, "blocks": BLOCKS, "zipf": ZIPF,
                             "tail": {"dist": "lognormal", "median": 150, "sigma": 0.7, "max": 3000}}}}
    c.update(over)
    return c


def _pooled(seed=0, duration=600, **over):
    return generate({"duration": duration, "block_size": 16, "clients": [_client(**over)]}, seed=seed)


def test_generated_pool_has_its_lengths_popularity_and_tail():
    t = _pooled()
    sp = prefixes.shared_prefixes(t)
    key, n = sp["key"], sp["blocks"]
    inp = t.table.column("input_tokens").to_numpy()
    # system prompt and pool prefixes overlap as little as their shares allow (0.3 + 0.6 <= 1)
    vals, cnt = np.unique(key[n == 2], return_counts=True)
    system = key == vals[cnt.argmax()]
    assert system.mean() == pytest.approx(0.3, abs=0.03)
    app = (key >= 0) & ~system
    assert app.mean() == pytest.approx(0.6, abs=0.03)
    keys, cnt = np.unique(key[app], return_counts=True)
    lens = {k: int(n[app][key[app] == k][0]) for k in keys}
    assert sorted(lens.values()) == sorted(BLOCKS)
    by_len = {lens[k]: c for k, c in zip(keys, cnt)}
    w = np.arange(1, 11) ** -ZIPF
    np.testing.assert_allclose([by_len[b] / cnt.sum() for b in BLOCKS], w / w.sum(), atol=0.02)
    # a pool request's prompt is its prefix plus the tail: never cut
    tail = inp[app] - n[app] * 16
    assert tail.min() >= 1 and np.median(tail) == pytest.approx(150, rel=0.1)


def test_fit_recovers_the_pool_and_regenerates_it():
    src = _pooled()
    c = fit_trace(src)["clients"][0]
    pool = c["prefix"]["pool"]
    assert pool["blocks"][:3] == BLOCKS[:3] and sorted(pool["blocks"]) == sorted(BLOCKS)
    assert pool["share"] == pytest.approx(0.6, abs=0.03) and "sessions" not in c
    p = np.array(pool["popularity"], float)
    w = np.arange(1, 11) ** -ZIPF
    np.testing.assert_allclose(p / p.sum(), w / w.sum(), atol=0.02)
    # the non-pool input is fitted apart from the pool's tail: its median stays the client's
    assert np.median(np.repeat(c["input"]["values"], c["input"]["weights"])) == pytest.approx(400, rel=0.1)
    gen = generate(fit_trace(src), seed=3)
    rows = {r["metric"]: r for r in compare_traces(src, gen)}
    for m in ("prefix_block_hit_ratio", "shared_prefix.share", "shared_prefix.blocks.p50",
              "shared_prefix.blocks.p90", "shared_prefix.top_share", "input_tokens.p50", "input_tokens.p90",
              "input_tokens.p99"):
        assert rows[m]["verdict"] == "pass", format_table(list(rows.values()))
    assert abs(rows["prefix_block_hit_ratio"]["b"] - rows["prefix_block_hit_ratio"]["a"]) < 0.02


def test_large_pools_fit_a_length_distribution_and_zipf(monkeypatch):
    monkeypatch.setattr(fit_mod, "MAX_POOL_LISTED", 5)
    pool = fit_trace(_pooled(duration=1200))["clients"][0]["prefix"]["pool"]
    assert pool["size"] == 10 and pool["zipf"] == pytest.approx(ZIPF, abs=0.1)
    assert pool["blocks"]["min"] == 2 and pool["blocks"]["max"] == 60
    g = generate({"duration": 300, "block_size": 16, "clients": [_client(prefix={"pool": pool})]}, seed=1)
    assert prefixes.prefix_pool_stats(g)["prefixes"] <= 10


def test_shared_prompts_are_not_conversations():
    """Independent requests that reuse one of two long application prompts (a few private
    blocks after it) are not turns: no sessions, a pool of the two prompts, and the hit ratio
    kept -- where a single app_blocks and conversation chains lost it."""
    rng = np.random.default_rng(0)
    ids, inp, nxt = [], [], 10_000
    for i in range(3000):
        app = [list(range(0, 87)), list(range(100, 112))][int(rng.random() < 0.3)]
        k = int(rng.integers(1, 4))
        ids.append(app + list(range(nxt, nxt + k)))
        nxt += k
        inp.append(16 * (len(ids[-1]) - 1) + int(rng.integers(1, 16)))
    t = Trace(pa.table({"arrival_ns": np.cumsum(rng.exponential(0.2e9, 3000)).astype(np.int64),
                        "input_tokens": np.array(inp, np.int32),
                        "output_tokens": rng.integers(5, 50, 3000).astype(np.int32),
                        "hash_ids": pa.array(ids, pa.list_(pa.int64()))}), {"block_size": 16})
    assert prefixes.turn_stats(t)["turns"]["max"] == 1
    c = fit_trace(t)["clients"][0]
    # the more popular prompt opens the most requests: it is read as the system prompt
    assert "sessions" not in c and c["prefix"]["system_blocks"] == 87 and c["prefix"]["pool"]["blocks"] == [12]
    assert c["prefix"]["system_share"] + c["prefix"]["pool"]["share"] == pytest.approx(1.0, abs=0.01)
    src_hit = stats.prefix_cache_hits(t, 16)["block_hit_ratio"]
    for seed in (1, 2, 3):
        assert stats.prefix_cache_hits(generate(fit_trace(t), seed=seed), 16)["block_hit_ratio"] == \
            pytest.approx(src_hit, abs=0.02)


def test_branched_turns_keep_part_of_the_history():
    spec = {"duration": 1800, "block_size": 16, "clients": [_client(
        rate=3.0, prefix={"system_blocks": 2, "system_share": 1.0},
        sessions={"turns": {"dist": "uniform", "low": 2, "high": 6}, "think_s": {"dist": "constant", "value": 20},
                  "user_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.5}, "branch": 0.3})]}
    t = generate(spec, seed=1)
    Trace(t.table, t.metadata)  # the block ids conform
    df = t.table.select(["session_id", "input_tokens", "hash_ids"]).to_pandas()
    kept = []
    for _, g in df.groupby("session_id", sort=False):
        for pi, ph, ch in zip(g.input_tokens[:-1], g.hash_ids[:-1], g.hash_ids[1:]):
            kept.append(list(ch[:pi // 16]) == list(ph[:pi // 16]))
    assert 1 - np.mean(kept) == pytest.approx(0.3, abs=0.04)
    # chains still find the branches (they keep a private block); fit reads the share back
    s = fit_trace(t.table.drop_columns(["session_id", "turn", "parent_id"]))["clients"][0]["sessions"]
    assert s["branch"] == pytest.approx(0.3, abs=0.05)
    assert prefixes.turn_stats(t, source="hash_ids")["turns"]["mean"] == pytest.approx(
        prefixes.turn_stats(t)["turns"]["mean"], rel=0.1)


def test_public_window_with_application_prompts(tmp_path):
    out = tmp_path / "apps.parquet"
    import_trace("mooncake", APPS, out)
    src = Trace.read(out)
    c = fit_trace(src)["clients"][0]
    pool = c["prefix"]["pool"]
    assert pool["blocks"][:2] == [12, 5] and pool["popularity"][0] > 2 * pool["popularity"][1]
    assert c["prefix"]["system_blocks"] == 1
    hit = stats.prefix_cache_hits(src, 512)["block_hit_ratio"]
    gen = generate(fit_trace(src), seed=1)
    assert stats.prefix_cache_hits(gen, 512)["block_hit_ratio"] == pytest.approx(hit, abs=0.05)


def test_describe_and_compare_agree_on_turns(tmp_path):
    """The same file: describe's conversation lines are the numbers compare judges (from
    session_id, and from hash_ids chains, which compare uses against a trace without
    session_id); describe prints no negative new tokens (Mooncake: p50 was -5,958; a
    branch's prompt may be shorter than its parent's)."""
    moon = tmp_path / "moon.parquet"
    import_trace("mooncake", APPS, moon)
    gen = tmp_path / "gen.parquet"
    generate(fit_trace(Trace.read(moon)), seed=1).write(gen)
    d = json.loads(run_cli("replay", "trace", "describe", gen, "--json", check=True).stdout)
    by_sid = {r["metric"]: r for r in compare_traces(Trace.read(gen), Trace.read(gen))}
    by_chain = {r["metric"]: r for r in compare_traces(Trace.read(gen), Trace.read(moon))}
    assert d["turns"]["turns"]["mean"] == pytest.approx(by_sid["turns_per_session.mean"]["a"])
    assert d["turns_from_hash_ids"]["turns"]["mean"] == pytest.approx(by_chain["turns_per_session.mean"]["a"])
    assert d["shared_prefixes"]["share"] == pytest.approx(by_chain["shared_prefix.share"]["a"], abs=0.01)
    text = run_cli("replay", "trace", "describe", moon, check=True).stdout
    new = next(line for line in text.splitlines() if "new tokens per turn" in line)
    assert "-" not in new.split("new tokens per turn")[1], new
    assert "shared prefixes" in text and "hash_ids chains" in run_cli(
        "replay", "trace", "describe", gen, check=True).stdout


@pytest.mark.parametrize("pool, needle", [
    ({"share": 0.5}, "clients[0].prefix.pool.blocks: is required"),
    ({"blocks": [3, 0]}, "clients[0].prefix.pool.blocks[1]: must be >= 1"),
    ({"blocks": [3, 4], "popularity": [1]}, "clients[0].prefix.pool.popularity: must be a list of 2 weights"),
    ({"blocks": [3, 4], "popularity": [1, 2], "zipf": 1}, "clients[0].prefix.pool.zipf: cannot be combined"),
    ({"blocks": {"dist": "constant", "value": 4}}, "clients[0].prefix.pool.size: is required"),
    ({"blocks": [3], "size": 2}, "clients[0].prefix.pool.size: must match the 1 prefix"),
])
def test_invalid_pool_names_field(pool, needle):
    with pytest.raises(SpecError) as e:
        parse_spec({"duration": 10, "clients": [_client(prefix={"pool": pool})]})
    assert needle in str(e.value)


def test_legacy_apps_are_a_pool_and_clash_with_one(tmp_path):
    legacy = parse_spec({"duration": 10, "clients": [_client(
        prefix={"system_blocks": 1, "apps": 3, "app_blocks": 7, "app_share": 0.4})]}).clients[0].prefix.pool
    assert (legacy.size, legacy.blocks, legacy.share, legacy.zipf) == (3, [7, 7, 7], 0.4, 0.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"duration": 10, "clients": [_client(
        prefix={"apps": 3, "app_blocks": 7, "pool": {"blocks": [2]}})]}))
    proc = run_cli("replay", "trace", "generate", "--spec", bad, "-o", tmp_path / "t.parquet")
    assert proc.returncode == 2 and "error: " in proc.stderr and "Traceback" not in proc.stderr
    assert "clients[0].prefix.apps: cannot be combined with pool" in proc.stderr
