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
    replay_run(trace, engine_url, tmp_path / "run", timeout=120)
    df = records(tmp_path / "run")
    assert len(df) == n and (df.status == "ok").all(), df.error.dropna().head()
    assert_well_formed(df)
    assert (df.completion_tokens == 6).all()  # min_tokens + ignore_eos honoured
    comp = df[df.request_id.astype(int) % 2 == 0]
    assert (comp.prompt_tokens == 24).all()  # token-id prompts are exact
    chat = df[df.request_id.astype(int) % 2 == 1]  # calibrated text, chat template included
    assert abs(chat.prompt_tokens.mean() - 24) <= 3, chat.prompt_tokens.describe()


def test_engine_fault_flags(tmp_path):
    eng = start_engine("--fault-error-rate", "0.15", "--fault-reject-rate", "0.15", "--fault-drop-rate", "0.15",
                       "--fault-malformed-rate", "0.15", "--fault-seed", "3")
    try:
        n = 60
        trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.02, input_tokens=16, output_tokens=6)
        replay_run(trace, eng.url, tmp_path / "run", timeout=120)
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
