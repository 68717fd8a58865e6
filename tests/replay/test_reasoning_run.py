"""Reasoning models, tool calls and chat-only targets end to end: `replay run` against SSE servers
on 127.0.0.1 that stream as vLLM does, checked against the servers' own write stamps."""
from __future__ import annotations

import numpy as np
import pytest

from llm_replay.reports import summarize_run
from tests.replay.runkit import assert_well_formed, records, replay_run, run_info, sse_server, write_trace
from tests.conftest import run_cli

N, OUT, REASON = 4, 30, 20          # requests, tokens each (max_tokens), of which reasoning
FIRST, GAP = 0.05, 0.01             # the server's first token after 50 ms (prefill), then 10 ms apart


def server_stamps(path) -> list[dict[int, tuple[float, float]]]:
    """Per request, in the order the server read them: {event index: (before, after)} in
    seconds of CLOCK_MONOTONIC; index -1 is when the request had been read."""
    by_rid: dict[str, dict] = {}
    for line in open(path):
        rid, idx, before, after = line.split()
        by_rid.setdefault(rid, {})[int(idx)] = (int(before) / 1e9, int(after) / 1e9)
    return sorted(by_rid.values(), key=lambda s: s[-1][0])


def within(t: float, write: tuple[float, float], tol: float = 1e-3) -> bool:
    """t is no further than tol from the interval in which the server wrote the event."""
    return write[0] - tol <= t <= write[1] + tol


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["reasoning", "tool_call"])
def test_reasoning_and_answer_times_match_the_servers_stamps(tmp_path, mode):
    log = tmp_path / "stamps.log"
    args = ["--reasoning", str(REASON), "--first-delay", str(FIRST), "--interval", str(GAP), "--stamp-log", str(log)]
    if mode == "tool_call":     # reasoning, then the answer as a tool call; usage reports reasoning_tokens
        args += ["--tool-calls", "1", "--report-reasoning", "--reasoning-field", "reasoning"]
    trace = write_trace(tmp_path / "t.parquet", N, gap_s=0.6, output_tokens=OUT)
    out = tmp_path / "run"
    with sse_server(*args) as url:
        replay_run(trace, url, out, "--api", "chat")
    df = records(out).sort_values("sent_s")
    assert_well_formed(df)
    assert (df.status == "ok").all() and len(df) == N
    t0 = run_info(out)["t0_monotonic"]
    stamps = server_stamps(log)[-N:]          # before them: the two chat calibration requests
    errs: list[float] = []                    # each token's distance from its write interval (s)
    for rec, srv in zip(df.itertuples(), stamps):
        tt = t0 + rec.sent_s + np.asarray(rec.token_times, dtype=np.float64)
        # every generated token is counted, reasoning included, each at its own arrival time
        assert len(tt) == OUT and sorted(k for k in srv if k >= 0) == list(range(OUT))
        errs.extend(max(srv[k][0] - t, t - srv[k][1], 0.0) for k, t in enumerate(tt))
        assert within(t0 + rec.first_token_s, srv[0]) and within(t0 + rec.first_answer_s, srv[REASON])
        assert t0 + rec.sent_s <= srv[-1][0]           # sent before the server had read it
        assert rec.reasoning_tokens == REASON and rec.reasoning_chunks == REASON
        assert rec.completion_tokens == OUT
    # every token at its own arrival: within 1 ms of its write (p99; a loaded host can defer one
    # kernel receive by a few ms, never by a token gap)
    assert np.percentile(errs, 99) <= 1e-3 and max(errs) < GAP, (np.percentile(errs, 99), max(errs))
    s = summarize_run(out)
    lat = s["latency"]
    server_ms = lambda a, b: np.median([srv[b][1] - srv[a][1] for srv in stamps]) * 1e3   # noqa: E731
    # TTFT is the first token of any kind (~50 ms), not the first answer token (~250 ms)
    assert FIRST * 1e3 - 1 <= lat["ttft_ms"]["p50"] < 100 and lat["ttfa_ms"]["p50"] > lat["ttft_ms"]["p50"] + 150
    assert lat["reasoning_ms"]["n"] == N and lat["reasoning_ms"]["p50"] == pytest.approx(server_ms(0, REASON), abs=1)
    assert lat["answer_ms"]["p50"] == pytest.approx(server_ms(REASON, OUT - 1), abs=1)
    # the server's gaps, over all tokens and over the answer only
    gaps = np.concatenate([np.diff([srv[k][1] for k in range(OUT)]) for srv in stamps]) * 1e3
    assert lat["icl_ms"]["n"] == N * (OUT - 1) and lat["itl_ms"]["n"] == N * (OUT - 1)   # one token per chunk
    assert lat["itl_ms"]["p50"] == pytest.approx(np.median(gaps), abs=1.0)
    assert lat["tpot_ms"]["p50"] == pytest.approx(server_ms(0, OUT - 1) / (OUT - 1), abs=1.0)
    assert lat["icl_answer_ms"]["n"] == N * (OUT - REASON - 1) and lat["itl_answer_ms"]["n"] == N * (OUT - REASON - 1)
    assert lat["tpot_answer_ms"]["p50"] == pytest.approx(server_ms(REASON, OUT - 1) / (OUT - REASON - 1), abs=1.0)
    r = s["reasoning"]
    assert (r["requests"], r["streamed"], r["no_answer"], r["tokens"]["p50"]) == (N, N, 0, REASON)
    model = s["breakdowns"]["model"][0]
    assert model["reasoning_tokens"]["p50"] == REASON and model["ttfa_ms"]["p50"] > model["ttft_ms"]["p50"]


def test_ttfa_gate_and_no_answer_requests(tmp_path):
    # the token budget (12) runs out while reasoning (20): no answer, no TTFA, not good under ttfa_ms
    trace = write_trace(tmp_path / "t.parquet", 6, gap_s=0.05, output_tokens=12)
    out = tmp_path / "run"
    with sse_server("--reasoning", str(REASON), "--interval", "0.002") as url:
        replay_run(trace, url, out, "--api", "chat")
    df = records(out)
    assert (df.status == "ok").all() and df.first_answer_s.isna().all() and (df.reasoning_chunks == 12).all()
    slo = tmp_path / "slo.yaml"
    slo.write_text("per_request: {ttfa_ms: 5000}\nobjectives: ['attainment >= 0.5', 'ttfa_ms.p50 <= 5000']\n")
    p = run_cli("replay", "gate", out, "--slo", slo)
    assert p.returncode in (1, 2) and "Traceback" not in p.stderr, p.stdout + p.stderr
    s = summarize_run(out, slo=str(slo))
    assert s["goodput"]["attainment"] == 0 and s["reasoning"]["no_answer"] == 6
    assert any("no answer" in w for w in s["warnings"])


def no_traceback(p) -> str:
    assert "Traceback" not in p.stderr and p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_chat_only_target_end_to_end_and_clear_errors(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 20, gap_s=0.01, output_tokens=5)
    with sse_server("--chat-only", "--interval", "0.001") as url:
        # with the capability check: only the chat API is probed for the run and calibrated
        p = run_cli("replay", "run", "--trace", trace, "--target", url, "--api", "chat", "-o", tmp_path / "ok",
                    "--no-progress", timeout=90)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        df = records(tmp_path / "ok")
        assert (df.status == "ok").all() and len(df) == 20 and (df.completion_tokens == 5).all()
        assert set(run_info(tmp_path / "ok")["config"]["calibration"]) == {"chat"}
        # the completions API against it: refused before the run, with the way out
        p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / "no", "--no-progress")
        line = no_traceback(p)
        assert url in line and "/v1/completions" in line and "404" in line and "--api chat" in line
        # text prompts for completions would need a completions calibration: named, not a traceback
        p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / "no2", "--no-progress",
                    "--no-check", "--prompt-mode", "text")
        line = no_traceback(p)
        assert "POST /v1/completions -> HTTP 404" in line and url in line


def test_html_and_dead_targets_are_one_line_errors(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 5, output_tokens=3)
    with sse_server("--html") as url:
        for extra in ((), ("--no-check",), ("--no-check", "--model-map", "*=m")):
            p = run_cli("replay", "run", "--trace", trace, "--target", url, "--api", "chat", "-o", tmp_path / "h",
                        "--no-progress", *extra)
            line = no_traceback(p)
            assert url in line and "text/html" in line or "GET /v1/models" in line, line
        assert "POST /v1/chat/completions" in line and "not a JSON object" in line
        p = run_cli("replay", "check", "--target", url)
        assert p.returncode == 1 and "Traceback" not in p.stderr
    p = run_cli("replay", "run", "--trace", trace, "--target", url, "--api", "chat", "-o", tmp_path / "d",
                "--no-progress", "--no-check", "--model-map", "*=m")
    line = no_traceback(p)      # the server is gone now: connection refused
    assert url in line and "POST /v1/chat/completions failed" in line
