"""`replay check` (official openai SDK) and `--scrape` of Prometheus metrics during a run."""
from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

import pyarrow.parquet as pq

from tests.conftest import free_port, run_cli
from tests.replay.runkit import records, sse_server, write_trace

METRICS = """# HELP vllm:num_requests_running Running requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m"} 1234.0
"""


def test_check_reports_capabilities(tmp_path):
    with sse_server() as url:
        p = run_cli("replay", "check", "--target", url, "--json", check=True)
        caps = json.loads(p.stdout)
        assert caps["models"] == ["sse-test"] and caps["list_models"]
        for k in ("chat", "chat_stream", "usage_in_stream", "completions", "completions_stream",
                  "token_id_prompts", "min_tokens_ignore_eos"):
            assert caps[k] is True, (k, caps["errors"])


def test_check_does_not_believe_a_reasoning_count_that_stays_zero():
    """Issue 22 item 6: a server that streams reasoning but reports 0 reasoning tokens."""
    for flag, said, believed in (("--report-reasoning", "reasoning_tokens in usage: yes", True),
                                 ("--report-reasoning-zero", "reasoning_tokens in usage: no, it reports 0", False)):
        with sse_server("--reasoning", "3", flag) as url:
            text = run_cli("replay", "check", "--target", url, check=True).stdout
            caps = json.loads(run_cli("replay", "check", "--target", url, "--json", check=True).stdout)
        assert said in text, text
        assert caps["reasoning_stream"] and caps["reasoning_tokens_in_usage"] is believed


@pytest.mark.timing
def test_check_fails_fast_on_a_dead_target():
    # refused: one line, exit 2, at once (not one connection error per probe)
    dead = run_cli("replay", "check", "--target", f"http://127.0.0.1:{free_port()}", timeout=30)
    assert dead.returncode == 2 and dead.stdout == "", dead.stdout
    assert dead.stderr.startswith("error: ") and dead.stderr.count("\n") == 1, dead.stderr
    assert "Connection refused" in dead.stderr and "Traceback" not in dead.stderr
    # a host that never answers the SYN (here: a full accept queue): one connect timeout, not one
    # 20 s timeout per probe (that was 42 s for a host that was down)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(0)
        fill = [socket.socket() for _ in range(4)]
        for c in fill:
            c.setblocking(False)
            c.connect_ex(s.getsockname())
        t = time.monotonic()
        hung = run_cli("replay", "check", "--target", f"http://127.0.0.1:{s.getsockname()[1]}", "--json", timeout=60)
        took = time.monotonic() - t
        for c in fill:
            c.close()
    assert hung.returncode == 2 and "cannot connect" in hung.stderr and "Traceback" not in hung.stderr, hung.stderr
    assert took < 30, took


@pytest.mark.timing
def test_run_uses_check_and_scrapes_metrics(tmp_path):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    trace = write_trace(tmp_path / "t.parquet", 100, gap_s=0.01)
    try:
        with sse_server("--interval", "0.001") as url:
            p = run_cli("replay", "run", "--trace", trace, "--target", url, "-o", tmp_path / "run", "--no-progress",
                        "--scrape", f"http://127.0.0.1:{srv.server_address[1]}/metrics", "--scrape-interval", "100ms",
                        check=True)
    finally:
        srv.shutdown()
    assert "prompt mode ids" in p.stderr and "'sse-test'" in p.stderr
    assert len(records(tmp_path / "run")) == 100
    m = pq.read_table(tmp_path / "run" / "server_metrics.parquet").to_pandas()
    running = m[m.name == "vllm:num_requests_running"]
    assert len(running) >= 5 and (running.value == 3.0).all()
    assert json.loads(running.labels.iloc[0]) == {"model_name": "m"}
    assert running.time_s.is_monotonic_increasing
    assert set(m.name) >= {"vllm:num_requests_running", "vllm:prompt_tokens_total"}
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["capabilities"]["token_id_prompts"] is True
