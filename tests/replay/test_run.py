"""`replay run` end to end on 127.0.0.1 against the SSE test server: records and run directory."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests.replay.runkit import (assert_well_formed, records, replay_run, run_info, sse_server,
                                 write_trace)

SECRET = "sk-test-DO-NOT-LEAK-4242"


@pytest.fixture(scope="module")
def server():
    with sse_server("--interval", "0.001") as url:
        yield url


def test_every_row_one_record_with_token_times_lag_and_run_json(tmp_path, server, monkeypatch):
    n = 300
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.004, input_tokens=37, output_tokens=7,
                        model=["a", "b", "c"] * 100, slo_class=["x"] * n)
    out = tmp_path / "run"
    monkeypatch.setenv("TEST_KEY", SECRET)
    proc = replay_run(trace, server, out, "--api-key-env", "TEST_KEY", "--model-map", "a=sse-test",
                      "--model-map", "*=other")
    df = records(out)
    assert len(df) == n and set(df.request_id) == {str(i) for i in range(n)}
    assert (df.status == "ok").all(), df.status.value_counts()
    assert_well_formed(df)
    assert (df.completion_tokens == 7).all() and (df.token_times.map(len) == 7).all()
    assert (df.prompt_tokens == 37).all()  # token-id prompts of the exact length
    assert set(df[df.model == "a"].target_model) == {"sse-test"}
    assert set(df[df.model == "b"].target_model) == {"other"}
    assert np.allclose(df.sort_values("scheduled_s").scheduled_s, np.arange(n) * 0.004)
    lag = df.sent_s - df.scheduled_s
    assert lag.notna().all() and (lag < 1.0).all()
    info = run_info(out)
    assert info["status"] == "completed" and info["status_counts"] == {"ok": n}
    assert info["trace"]["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert info["t0_wall"] > info["started_wall"] and info["workers"] == 1
    assert info["config"]["api_key_env"] == "TEST_KEY"
    for f in out.iterdir():  # the key itself is never written anywhere
        assert SECRET.encode() not in f.read_bytes(), f
    assert str(out) in proc.stdout and "ok 300" in proc.stdout


def test_window_speed_and_max_requests(tmp_path, server):
    trace = write_trace(tmp_path / "t.parquet", 400, gap_s=0.01)
    out = tmp_path / "run"
    replay_run(trace, server, out, "--start", "1s", "--duration", "2s", "--speed", "4", "--max-requests", "150",
               "--warmup", "3", "--spin-ms", "1")  # warm-up requests are not recorded
    df = records(out).sort_values("scheduled_s")
    assert len(df) == 150 and df.request_id.tolist() == [str(i) for i in range(100, 250)]
    assert np.allclose(df.scheduled_s, np.arange(150) * 0.01 / 4)
    assert (df.status == "ok").all()


def test_chat_text_prompts_are_calibrated_and_prompt_column_is_verbatim(tmp_path, server):
    n = 40
    prompts = [None] * n
    prompts[5] = "one two three four five six"
    trace = write_trace(tmp_path / "t.parquet", n, input_tokens=300, output_tokens=3, prompt=prompts)
    out = tmp_path / "run"
    replay_run(trace, server, out, "--api", "chat")
    df = records(out)
    assert (df.status == "ok").all()
    row5 = df[df.request_id == "5"].iloc[0]
    assert row5.prompt_tokens == 6  # the test server counts words: sent verbatim
    others = df[df.request_id != "5"]
    err = (others.prompt_tokens - 300) / 300  # word lengths vary; the calibration holds on average
    assert abs(err.mean()) < 0.03 and err.abs().max() < 0.15, others.prompt_tokens.describe()
    assert json.loads((out / "run.json").read_text())["config"]["calibration"]["chat"]


def test_bad_inputs_are_one_line_errors(tmp_path, server):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    p = replay_run(bad, server, tmp_path / "r1", check=False)
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr
    trace = write_trace(tmp_path / "t.parquet", 10)
    p = replay_run(trace, server, tmp_path / "r2", "--start", "100s", check=False)
    assert p.returncode == 2 and "no trace rows" in p.stderr
    p = replay_run(trace, "http://127.0.0.1:9", tmp_path / "r3", check=False)
    assert p.returncode == 2 and "/v1/models" in p.stderr
    p = replay_run(trace, server, tmp_path / "r4", "--api-key-env", "SURELY_UNSET_VAR_X", check=False)
    assert p.returncode == 2 and "SURELY_UNSET_VAR_X" in p.stderr
    # types that validate casts (string arrival_ns) are cast for the run too; text that is no
    # number is validate's one-line error (both were an ArrowInvalid traceback)
    import pyarrow as pa
    import pyarrow.parquet as pq
    for name, arrivals in (("s.parquet", ["0", "1000000"]), ("x.parquet", ["0", "soon"])):
        pq.write_table(pa.table({"arrival_ns": arrivals, "input_tokens": pa.array([8, 8], pa.int32()),
                                 "output_tokens": pa.array([2, 2], pa.int32())}), tmp_path / name)
    p = replay_run(tmp_path / "s.parquet", server, tmp_path / "r5", "--model-map", "*=m", check=False)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    p = replay_run(tmp_path / "x.parquet", server, tmp_path / "r6", check=False)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "'soon'" in p.stderr, p.stderr


@pytest.mark.slow
def test_model_map_line_names_only_the_unmapped_models(tmp_path, server):
    trace = write_trace(tmp_path / "t.parquet", 6, model=["a", "b", "c"] * 2)
    every = ["--model-map", "a=sse-test", "--model-map", "b=sse-test", "--model-map", "c=sse-test"]
    p = replay_run(trace, server, tmp_path / "r1", *every)
    assert "trace models" not in p.stderr, p.stderr  # all three are mapped: nothing falls back
    p = replay_run(trace, server, tmp_path / "r2", *every[:4])
    assert "trace models not in --model-map (c) -> 'sse-test'" in p.stderr, p.stderr
    p = replay_run(trace, server, tmp_path / "r3")
    assert "trace models -> 'sse-test'" in p.stderr, p.stderr
    assert set(records(tmp_path / "r2").target_model) == {"sse-test"}
