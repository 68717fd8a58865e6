"""Prompts: exact token-id lengths, shared hash_ids blocks byte-identical, text calibration, sessions."""
from __future__ import annotations

import json

import pytest

from replay import plan
from replay.prompts import ID_HIGH, ID_LOW, PromptBuilder, PromptError, corpus_text
from tests.replay.runkit import assert_well_formed, records, replay_run, sse_server, write_trace


def row(idx, n_in, hash_ids=None, n_out=8, prompt=None):
    return (idx, str(idx), 0.0, n_in, n_out, None, None, None, None, None, prompt, hash_ids)


def builder(**kw) -> PromptBuilder:
    return PromptBuilder(plan.RunConfig(trace="t", target="http://x", run_dir="r", block_size=4, **kw))


def test_ids_exact_length_range_and_prefix_sharing():
    b = builder(seed=7)
    a, c, d = b.ids(row(0, 13, [11, 22, 33])), b.ids(row(1, 10, [11, 22])), b.ids(row(2, 13, [11, 99, 33]))
    assert len(a) == 13 and len(c) == 10 and all(ID_LOW <= t < ID_HIGH for t in a + c)
    assert a[:8] == c[:8]          # equal blocks -> identical ids
    assert a[:4] == d[:4] and a[4:8] != d[4:8]
    assert a[12:] != c[8:9] or a[8:] != c[8:]  # the tails are the rows' own
    assert builder(seed=7).ids(row(0, 13, [11, 22, 33])) == a  # deterministic
    assert builder(seed=8).ids(row(0, 13, [11, 22, 33])) != a
    assert len(b.ids(row(3, 5, [1, 2, 3]))) == 5  # blocks longer than the prompt are cut


def test_text_blocks_are_byte_identical_and_lengths_follow_calibration():
    b = builder(prompt_mode="text", calibration={"completions": [2.0, 0.25]})
    t1 = b.text(row(0, 400, [5, 6]), "completions")
    t2 = b.text(row(1, 400, [5, 6, 7]), "completions")
    shared = corpus_text(0, 5, round(4 / 0.25)) + corpus_text(0, 6, round(4 / 0.25))
    assert t1.startswith(shared) and t2.startswith(shared) and len(shared) > 20
    assert t1[len(shared):len(shared) + 10] != t2[len(shared):len(shared) + 10]
    assert abs(len(t1) - (400 - 2) / 0.25) < 20
    b.observe("completions", len(t1), 2 * 400)  # the server saw twice the tokens: shorten
    assert len(b.text(row(2, 400), "completions")) < 0.95 * len(t1)


def test_body_forces_output_length_and_verbatim_prompt():
    b = builder(force_output_len=True)
    path, body, _, _ = b.body(row(0, 5, prompt="hello there"), "m", "completions")
    req = json.loads(body)
    assert path == "/v1/completions" and req["prompt"] == "hello there"
    assert req["max_tokens"] == req["min_tokens"] == 8 and req["ignore_eos"] is True and req["stream"]
    path, body, _, _ = builder(force_output_len=False).body(row(0, 5, n_out=None), "m", "chat",
                                                            history=[{"role": "user", "content": "x"}])
    req = json.loads(body)
    assert path == "/v1/chat/completions" and len(req["messages"]) == 2
    assert "max_tokens" not in req and "ignore_eos" not in req


def test_tokenizer_missing_library_is_a_clear_error(tmp_path):
    try:
        import tokenizers  # noqa: F401
        pytest.skip("tokenizers is installed")
    except ImportError:
        pass
    with pytest.raises(PromptError, match="tokenizers"):
        builder(tokenizer=str(tmp_path / "tokenizer.json"))


def test_closed_sessions_carry_history_and_wait_for_previous_turn(tmp_path):
    n = 24  # 6 sessions x 4 turns, all turns of a session at the same trace time
    sid = [f"s{i % 6}" for i in range(n)]
    turn = [i // 6 for i in range(n)]
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.001, input_tokens=30, output_tokens=5,
                        session_id=sid, turn=turn)
    with sse_server("--interval", "0.005") as url:
        replay_run(trace, url, tmp_path / "run", "--api", "chat", "--sessions", "closed", "--model-map", "*=m")
    df = records(tmp_path / "run")
    assert len(df) == n and (df.status == "ok").all()
    assert_well_formed(df)
    for _, g in df.assign(turn=turn).sort_values("turn").groupby("session_id"):
        assert (g.sent_s.values[1:] >= g.last_token_s.values[:-1]).all(), "turn k+1 after turn k ended"
        assert (g.prompt_tokens.diff().dropna() > 0).all(), "the history grows"


def test_sessions_timestamps_mode_history_and_user_tokens():
    from replay.sessions import Sessions
    s = Sessions("timestamps")
    r0 = (0, "a", 0.0, 50, 5, None, "s", 0, None, None, None, None)
    r1 = (1, "b", 1.0, 80, 5, None, "s", 1, None, None, None, None)
    assert s.admit(r0) and s.admit(r1)  # never gated: turns go at their trace times
    assert s.context(r0) == ([], 50)
    assert s.completed(r0, "hi", "hello", True, 50, 5, 0.5) is None
    history, user_tokens = s.context(r1)
    assert [m["role"] for m in history] == ["user", "assistant"] and user_tokens == 80 - 55
    s.completed(r1, "x", None, False, None, None, 2.0)  # a failed turn adds no history
    assert len(s.context(r1)[0]) == 2
