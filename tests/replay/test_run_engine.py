"""`replay run` against the reference engine (engine-stub): exact lengths, chat, and its fault flags."""
from __future__ import annotations

import pytest

from tests.conftest import start_engine
from tests.replay.runkit import assert_well_formed, records, replay_run, write_trace

pytest.importorskip("torch")
pytest.importorskip("llm_replay.engine_stub.cli")


def test_engine_exact_lengths_completions_and_chat(tmp_path, engine_url):
    n = 30
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.03, input_tokens=24, output_tokens=6,
                        api=["completions", "chat"] * (n // 2))
    # --salt 0: the calibrated chat lengths below are judged on one fixed text (each salt draws other
    # words, and 15 prompts of 24 tokens average within 3 tokens on most salts, not all)
    replay_run(trace, engine_url, tmp_path / "run", "--salt", "0", timeout=120)
    df = records(tmp_path / "run")
    assert len(df) == n and (df.status == "ok").all(), df.error.dropna().head()
    assert_well_formed(df)
    assert (df.completion_tokens == 6).all()  # min_tokens + ignore_eos honoured
    comp = df[df.request_id.astype(int) % 2 == 0]
    assert (comp.prompt_tokens == 24).all()  # token-id prompts are exact
    chat = df[df.request_id.astype(int) % 2 == 1]  # calibrated text, chat template included
    assert abs(chat.prompt_tokens.mean() - 24) <= 3, chat.prompt_tokens.describe()


@pytest.mark.slow
def test_engine_fault_flags(tmp_path):
    eng = start_engine("--fault-error-rate", "0.15", "--fault-reject-rate", "0.15", "--fault-drop-rate", "0.15",
                       "--fault-malformed-rate", "0.15", "--fault-seed", "3")
    try:
        n = 60
        trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.02, input_tokens=16, output_tokens=6)
        replay_run(trace, eng.url, tmp_path / "run", "--max-error-rate", "1", timeout=120)   # failures on purpose
    finally:
        eng.stop()
    df = records(tmp_path / "run")
    assert len(df) == n and df.request_id.is_unique
    assert_well_formed(df)
    http = df[df.status == "http_error"].http_status.value_counts().to_dict()
    assert http.get(500, 0) > 0 and http.get(429, 0) > 0, http
    assert (df.status == "protocol_error").sum() > 0 and (df.status == "connection_error").sum() + \
        (df.status == "protocol_error").sum() > 2, df.status.value_counts()
    assert (df.status == "ok").sum() > n // 4


@pytest.mark.slow
def test_each_run_salts_its_prompts_so_a_second_run_is_not_flattered(tmp_path):
    """Issue 22 item 3: the same trace replayed twice with the same bytes hits the prefix cache
    the first run filled; by default each run salts its prompts (run.json config.salt), and the
    report sets the server's prefix-cache hits against the reuse the trace's hash_ids intend."""
    import json
    n = 24   # every row its own six blocks: the trace intends no reuse at all
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.02, input_tokens=96, output_tokens=2,
                        hash_ids=[[i * 10 + k for k in range(6)] for i in range(n)])
    eng = start_engine()
    try:
        def run(name, *args):
            replay_run(trace, eng.url, tmp_path / name, "--scrape", f"{eng.url}/metrics", "--scrape-interval",
                       "100ms", *args, timeout=120)
            return json.loads((tmp_path / name / "summary.json").read_text())
        first, repeat, fresh = run("a", "--salt", "5"), run("b", "--salt", "5"), run("c")
    finally:
        eng.stop()
    salts = [json.loads((tmp_path / d / "run.json").read_text())["config"]["salt"] for d in "abc"]
    assert salts[0] == salts[1] == 5 and salts[2] != 5
    for s in (first, repeat, fresh):
        assert s["prefix_cache"]["intended_token_hit_ratio"] == 0.0 and s["prefix_cache"]["server_queries"] > 0
    assert repeat["prefix_cache"]["server_hit_ratio"] > 0.5 and "flattered" in repeat["prefix_cache"]["warning"]
    assert any("flattered" in w for w in repeat["warnings"])
    for s in (first, fresh):   # a new salt: nothing of the earlier runs is reused
        assert s["prefix_cache"]["server_hit_ratio"] < 0.05 and s["prefix_cache"]["warning"] is None
