"""Issue 36 item 1: text prompts at the context edge. Against engine-stub with a 1024-token
context, the text calibration fits that context, a built prompt is never counted longer than its
row's input_tokens (the server's usage, its own tokenizer and chat template), so rows cut exactly
at the context all succeed; rows that cannot fit are named before anything is sent."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llm_replay.traces.trace import Trace
from tests.conftest import run_cli, start_engine
from tests.replay.runkit import records, run_info

CONTEXT = 1024


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("torch")
    eng = start_engine("--max-model-len", str(CONTEXT))
    yield eng
    eng.stop()


def _trace(path, lengths, outputs, apis, block_size=16):
    n = len(lengths)
    hash_ids = [list(range(i % 3, i % 3 + k // block_size)) if i % 2 else None for i, k in enumerate(lengths)]
    Trace(pa.table({"arrival_ns": pa.array(np.arange(n, dtype=np.int64) * 20_000_000),
                    "request_id": [f"r{i}" for i in range(n)],
                    "input_tokens": pa.array(lengths, pa.int32()), "output_tokens": pa.array(outputs, pa.int32()),
                    "api": apis, "hash_ids": pa.array(hash_ids, pa.list_(pa.int64()))}),
          {"block_size": block_size}).write(path)
    return path


def _run(trace, url, out, *args):
    return run_cli("replay", "run", "--trace", trace, "--target", url, "-o", out, "--no-progress", *args,
                   timeout=300, check=False)


def test_text_prompts_fit_the_context_and_never_exceed_input_tokens(tmp_path, engine):
    """Lengths from 20 to 1020 tokens, the 4 longest cut exactly at the context (input + output =
    1024, output forced): every request succeeds and the server counts at most input_tokens
    (the stated bound: 0 over), at most 2 under, for chat and for text completions."""
    lengths = [20, 33, 64, 100, 257, 500, 777, 1000, 1016, 1020] * 2
    outputs = ([4] * 6 + [CONTEXT - k for k in lengths[6:10]]) * 2
    apis = ["chat"] * 10 + ["completions"] * 10
    trace = _trace(tmp_path / "t.parquet", lengths, outputs, apis)
    p = _run(trace, engine.url, tmp_path / "run", "--prompt-mode", "text")
    assert p.returncode == 0, p.stdout + p.stderr
    df = records(tmp_path / "run")
    assert len(df) == len(lengths) and (df.status == "ok").all(), df[["request_id", "status", "error"]]
    over = df.prompt_tokens - df.input_tokens
    assert over.max() <= 0 and over.min() >= -2, df[["request_id", "api", "input_tokens", "prompt_tokens"]]
    cal = run_info(tmp_path / "run")["calibration"]
    assert set(cal) == {"chat", "completions"}
    for c in cal.values():   # several lengths, none beyond the context, the bound stated
        assert c["max_model_len"] == CONTEXT and len(c["probes"]) >= 3 and c["max_over_tokens"] == 0
        assert max(t for _, t in c["probes"]) < CONTEXT


def test_rows_longer_than_the_context_are_named_before_sending(tmp_path, engine):
    lengths = [100] * 6 + [1000, 2000, 900, 1500, 1100]
    outputs = [8] * 6 + [100, 8, 200, 8, 8]
    trace = _trace(tmp_path / "t.parquet", lengths, outputs, ["chat"] * len(lengths))
    p = _run(trace, engine.url, tmp_path / "run")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 5 of 11 trace rows need more than 'tiny''s context (max_model_len 1024; "
                           "input + output tokens up to 2008; request ids r6, r7, r8, ...)"), last
    assert "replay trace transform" in last and "--clip-input" in last and "--no-check" in last, last
    assert not (tmp_path / "run" / "records.parquet").exists()


def test_calibration_stops_where_a_context_it_was_not_told_refuses(tmp_path):
    """--no-check with --model-map: no model list, so no max_model_len; the first probe the server
    refuses (128 words > 64 tokens) ends the calibration, which the probes before it serve."""
    from tests.replay.runkit import sse_server
    trace = _trace(tmp_path / "t.parquet", [10, 30, 56], [4, 4, 8], ["chat"] * 3)
    with sse_server("--max-model-len", "64") as url:
        p = _run(trace, url, tmp_path / "run", "--no-check", "--model-map", "*=sse-test", "--api", "chat")
    assert p.returncode == 0, p.stderr
    df = records(tmp_path / "run")
    assert (df.status == "ok").all() and (df.prompt_tokens == df.input_tokens).all(), df
    cal = run_info(tmp_path / "run")["calibration"]["chat"]
    assert cal["probes"] == [[8, 8], [32, 32]] and cal["max_model_len"] is None
