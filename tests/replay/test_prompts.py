"""Prompts: exact token-id lengths, shared hash_ids blocks byte-identical, text calibration, sessions."""
from __future__ import annotations

import json
import sys

import pytest

from llm_replay.replay import plan
from llm_replay.replay.prompts import ID_HIGH, ID_LOW, PromptBuilder, PromptError, corpus_text
from tests.replay.runkit import assert_well_formed, records, replay_run, run_info, sse_server, write_trace


def row(idx, n_in, hash_ids=None, n_out=8, prompt=None, images=None, px=None):
    r = (idx, str(idx), 0.0, n_in, n_out, None, None, None, None, None, prompt, hash_ids, images, px)
    return r + (None,) * (plan.ROW_LEN - len(r))


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
    b = builder(prompt_mode="text", calibration={"completions": [2.0, 0.5]})   # 2 tokens a word
    t1 = b.text(row(0, 400, [5, 6]), "completions")
    t2 = b.text(row(1, 400, [5, 6, 7]), "completions")
    shared = corpus_text(0, 5, round(4 / 0.5)) + corpus_text(0, 6, round(4 / 0.5))
    assert t1.startswith(shared) and t2.startswith(shared) and shared.count(" ") == 16
    assert t1[len(shared):len(shared) + 10] != t2[len(shared):len(shared) + 10]
    assert t1.count(" ") == (400 - 2) / 0.5   # words: on the line, never over it
    assert b.text(row(3, 401), "completions").count(" ") == 798
    b.observe("completions", (t1.count(" "), 0), 2 * 400)  # the server saw twice the tokens: shorten
    assert b.text(row(2, 400), "completions").count(" ") < 0.95 * t1.count(" ")
    b.observe("completions", (t1.count(" "), 0), 100)   # fewer: never longer than the calibration says
    b.observe("completions", (t1.count(" "), 0), 100)
    assert b.text(row(2, 400), "completions").count(" ") <= 796


def test_continuations_leave_room_for_the_replies_the_server_retokenizes():
    """A continuation's history holds replies the server counts anew from their text: the new
    turn leaves 4 tokens free, then the most the server counted over its aim."""
    b = builder(prompt_mode="text", calibration={"chat": [12.0, 1.0]})
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    _, body, sized, text = b.body(row(0, 1000), "m", "chat", history, 300)   # 700 tokens of history
    assert text.count(" ") == 300 - 12 - 4 and sized == (0, 996)
    assert len(json.loads(body)["messages"]) == 3
    b.observe("chat", sized, 996 + 7)    # 7 over its aim
    assert b.body(row(1, 1000), "m", "chat", history, 300)[3].count(" ") == 300 - 12 - 7
    b.observe("chat", (0, 993), 993)     # on its aim: the margin stays
    assert b.body(row(2, 1000), "m", "chat", history, 300)[2] == (0, 993)
    _, _, sized, text = b.body(row(3, 50), "m", "chat", [], 50)   # a session's first turn: whole
    assert sized == (text.count(" "), 0) and text.count(" ") == 38


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


def test_tokenizer_missing_library_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)   # as where the package is not installed
    with pytest.raises(PromptError, match="pip install tokenizers"):
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
    from llm_replay.replay.sessions import Sessions
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


# --- --tokenizer: exact text prompts ------------------------------------------------------
# Tokenizers are trained here, on replay's own corpus, with the `tokenizers` library (no hub
# downloads). Each is saved with a BOS post-processor: special tokens must not be counted.

def _tokenizer_file(path, kind: str) -> str:
    tk = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers
    corpus = [corpus_text(1, i, 2000) for i in range(40)]
    if kind == "words":  # one token per corpus word: the SSE test server's count
        from llm_replay.replay.prompts import _WORDS
        tok = tk.Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<s>", *dict.fromkeys(_WORDS)])},
                                            unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    elif kind == "wordpiece":  # BERT style: greedy longest-match subwords
        tok = tk.Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=150, special_tokens=["<unk>", "<s>"]))
    elif kind == "long-tokens":  # BPE merged across words: ~10 chars per token, more than budgeted
        tok = tk.Tokenizer(models.BPE())
        tok.train_from_iterator([corpus_text(1, i, 4000) for i in range(400)],
                                trainers.BpeTrainer(vocab_size=20000, special_tokens=["<s>"]))
    else:  # BPE with few merges (words split into pieces): byte-level (GPT-2/Llama-3) or metaspace (SentencePiece)
        tok = tk.Tokenizer(models.BPE())
        tok.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if kind == "bytelevel"
                             else pre_tokenizers.Metaspace())
        alphabet = pre_tokenizers.ByteLevel.alphabet() if kind == "bytelevel" else []
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"],
                                                            initial_alphabet=alphabet))
    bos = ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])
    out = str(path / f"{kind}.json")
    tok.save(out)
    return out


LENGTHS = (1, 2, 7, 15, 16, 17, 100, 1000, 3000)


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace", "wordpiece", "long-tokens"])
def test_tokenizer_text_prompts_have_exact_lengths_and_shared_block_prefixes(tmp_path, kind):
    from tokenizers import Tokenizer
    path = _tokenizer_file(tmp_path, kind)
    tok = Tokenizer.from_file(path)
    b = builder(prompt_mode="text", tokenizer=path, seed=3)  # block_size 4
    count = lambda text, special=False: len(tok.encode(text, add_special_tokens=special).ids)  # noqa: E731
    for i, n in enumerate(LENGTHS):
        for api, hash_ids in (("completions", None), ("chat", [1]), ("completions", [1, 2, 3])):
            text = b.text(row(i, n, hash_ids), api)
            assert count(text) == n, (kind, n, hash_ids, count(text))
            assert count(text, special=True) == n + 1  # the BOS is the server's, not the prompt's
    if kind == "long-tokens":  # the case stays meaningful: more characters per token than budgeted
        assert len(b.text(row(40, 3000), "completions")) > 8 * 3000 + 16
    # sessions pass the user turn's own token count
    assert count(b.text(row(50, 900, [1, 2]), "chat", tokens=40)) == 40

    blocks = corpus_text(3, 1, 4) + corpus_text(3, 2, 4)  # blocks of bs words
    long_a, long_b = b.text(row(60, 1000, [1, 2, 3]), "completions"), b.text(row(61, 1000, [1, 2, 9]), "completions")
    assert long_a.startswith(blocks) and long_b.startswith(blocks) and len(blocks) > 50
    assert long_a[len(blocks):len(blocks) + 20] != long_b[len(blocks):len(blocks) + 20], "block 3 is not block 9"
    short = b.text(row(62, 3, [1, 2]), "completions")  # cut inside the first block
    assert count(short) == 3 and blocks.startswith(short)
    no_blocks = [b.text(row(k, 100), "completions") for k in (70, 71)]
    assert no_blocks[0][:30] != no_blocks[1][:30], "rows without blocks share nothing"
    again = builder(prompt_mode="text", tokenizer=path, seed=3)
    assert again.text(row(60, 1000, [1, 2, 3]), "completions") == long_a  # deterministic


def test_replay_run_with_tokenizer_sends_exact_text_prompts(tmp_path):
    """End to end: a word-level tokenizer counts what the SSE test server counts (words), so the
    server's usage.prompt_tokens must equal every row's input_tokens."""
    import numpy as np
    import pyarrow as pa

    from llm_replay.traces.trace import Trace
    path = _tokenizer_file(tmp_path, "words")
    n = 60
    lengths = [LENGTHS[i % len(LENGTHS)] for i in range(n)]
    hash_ids = [list(range(i % 3, i % 3 + min(3, -(-k // 16)))) if i % 2 else None for i, k in enumerate(lengths)]
    table = pa.table({"arrival_ns": pa.array(np.arange(n, dtype=np.int64) * 2_000_000),
                      "input_tokens": pa.array(lengths, pa.int32()),
                      "output_tokens": pa.array([3] * n, pa.int32()),
                      "api": ["chat" if i % 4 == 0 else None for i in range(n)],
                      "hash_ids": pa.array(hash_ids, pa.list_(pa.int64()))})
    trace = tmp_path / "t.parquet"
    Trace(table, {"block_size": 16}).write(trace)
    with sse_server("--interval", "0.001", "--chat-template-tokens", "16") as url:   # as a real template
        proc = replay_run(trace, url, tmp_path / "run", "--prompt-mode", "text", "--tokenizer", path,
                          "--model-map", "*=m")
    df = records(tmp_path / "run")
    assert len(df) == n and set(df.request_id) == {str(i) for i in range(n)}
    assert (df.status == "ok").all(), df.status.value_counts()
    assert_well_formed(df)
    short_chat = (df.request_id.astype(int) % 4 == 0) & (df.input_tokens <= 16)   # shorter than the template
    assert (df.prompt_tokens == df.input_tokens)[~short_chat].all(), df[df.prompt_tokens != df.input_tokens]
    assert (df.prompt_tokens[short_chat] == 17).all()     # one token of text: the least a message can be
    info = run_info(tmp_path / "run")
    assert info["tokenizer"]["path"] == path and info["tokenizer"]["vocab_size"] > 50
    assert info["config"]["prompt_mode"] == "text" and not info["config"]["calibration"]  # no calibration
    assert info["config"]["template_tokens"] == {"chat": 16}   # measured once: chat rows are not 16 over
    assert f"exact token counts with {path}" in proc.stderr


def test_bad_tokenizer_file_is_a_one_line_error(tmp_path):
    pytest.importorskip("tokenizers")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    trace = write_trace(tmp_path / "t.parquet", 5)
    with sse_server() as url:
        p = replay_run(trace, url, tmp_path / "run", "--prompt-mode", "text", "--tokenizer", bad, check=False)
    assert p.returncode == 2 and "cannot load tokenizer.json" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists()
