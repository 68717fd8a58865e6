"""replay.client against the real sse_server over 127.0.0.1 (plain and TLS).

The client needs gevent, and pytest's process must stay unpatched, so all scenarios run once
in a child process (tests/replay/client_driver.py); each test checks one scenario's outcome.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from tests.conftest import repo_env, wait_s

STREAM_FAULTS = ("done_early", "trailers", "split", "coalesce", "crlf", "comments", "identity", "no_done")


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.replay.sse_server", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=repo_env(), start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith("sse-server ready: "):
        proc.kill()
        raise RuntimeError(f"sse_server did not start: {line}{proc.stdout.read()}")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, line.split(": ", 1)[1].strip()


def make_cert(d) -> tuple[str, str]:
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    procs = []
    try:
        proc, url = start_server()
        procs.append(proc)
        args = [url]
        try:
            cert, key = make_cert(tmp_path_factory.mktemp("tls"))
            tproc, turl = start_server("--tls", cert, key)
            procs.append(tproc)
            args += [turl, cert]
        except (OSError, subprocess.CalledProcessError):
            pass     # no openssl binary: TLS tests skip
        run = subprocess.run([sys.executable, "-m", "tests.replay.client_driver", *args],
                             capture_output=True, text=True, env=repo_env(), timeout=wait_s(120))
        assert run.returncode == 0, run.stderr[-4000:]
        return json.loads(run.stdout)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def test_completions_stream_ok_with_usage_and_text(out):
    r = out["completions"]
    assert r["status"] == "ok" and r["http_status"] == 200 and r["error"] is None
    assert r["n"] == 8 and r["monotone"] and r["after_sent"] and r["first_ok"] and r["last_ok"]
    assert (r["prompt_tokens"], r["completion_tokens"]) == (4, 8)
    assert r["text"] == "".join(f" t{i}" for i in range(8))
    assert out["on_sent_called"]


def test_chat_role_chunk_is_not_a_token_and_connection_is_reused(out):
    for key in ("chat", "chat_fast"):
        r = out[key]
        assert r["status"] == "ok" and r["n"] == 5, r
        assert r["reused"] and r["opened"] == 1
    assert out["chat"]["text"] == " t0 t1 t2 t3 t4"
    assert out["chat"]["prompt_tokens"] == 3 and out["chat_fast"]["prompt_tokens"] is None


def test_kernel_timestamps_are_not_delayed_by_a_busy_client(out):
    k, r = out["busy_kernel_ts"], out["busy_read_ts"]
    assert k["status"] == r["status"] == "ok" and k["n"] == r["n"] == 30 and k["after_sent"]
    assert r["inside"] == 0       # read-time stamps cannot fall while the process was blocked
    assert k["inside"] >= 1       # kernel receive times do: the bytes arrived meanwhile


def test_a_read_after_the_alarms_due_time_wakes_the_dispatcher(out):
    a = out["alarm_preempted"]
    assert a["armed"] and a["woke"] and a["woke_mid_stream"] and a["due_reset"]
    assert a["stream"]["status"] == "ok" and a["stream"]["n"] == 5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_pool_starts_no_thread_and_sizes_the_fd_table_up_front(out):
    n = out["no_threads"]
    assert n["ok"] == 200 and n["opened"] >= 100     # a real burst of new connections
    assert n["threads_added"] == 0
    assert n["fdsize_at_init"] >= 1024 and n["fdsize_after"] == n["fdsize_at_init"]


def test_non_sse_200_is_a_protocol_error(out):
    assert out["not_streamed"]["status"] == "protocol_error"
    assert "event-stream" in out["not_streamed"]["error"]


@pytest.mark.timing   # a reader woken > 20 ms late finds the kernel has merged two segments: one stamp (docs/client.md)
def test_tokens_are_stamped_per_event_not_batched(out):
    r = out["interval_unbatched"]     # events 20 ms apart must get 6 distinct arrival times
    assert r["status"] == "ok" and r["n"] == 6 and r["distinct"] == 6


@pytest.mark.parametrize("fault,status,http", [("http500", "http_error", 500), ("http429", "http_error", 429),
                                               ("malformed", "protocol_error", 200),
                                               ("error_in_stream", "http_error", 200),
                                               ("drop", "connection_error", 200), ("stall", "timeout", 200)])
def test_faults_map_to_statuses_and_pool_recovers(out, fault, status, http):
    r = out[fault]
    assert (r["status"], r["http_status"]) == (status, http), r
    assert r["error"] and r["sent"]
    nxt = out[fault + "_next"]
    assert nxt["status"] == status     # the same fault again on the same pool: no stale state
    if fault in ("http500", "http429"):
        assert nxt["reused"], "an error response with a body keeps the connection alive"
    else:
        assert not nxt["reused"], "a broken stream's connection is discarded"
    if fault in ("drop", "stall"):
        assert r["n"] == 4      # tokens before the fault are kept
    if fault == "error_in_stream":
        assert "injected engine failure" in r["error"] and r["n"] == 2


@pytest.mark.parametrize("fault", STREAM_FAULTS)
def test_stream_shapes_parse_fully(out, fault):
    r, nxt = out[fault], out[fault + "_next"]
    assert r["status"] == "ok" and r["n"] == 8 and r["monotone"], r
    assert r["completion_tokens"] == 8
    assert nxt["status"] == "ok" and nxt["n"] == 8
    # identity bodies end with the connection; chunked ones leave it reusable, including
    # when [DONE] came before the terminator or trailers followed it
    assert nxt["reused"] == (fault != "identity")


def test_fault_selected_by_model_name(out):
    assert (out["model_fault"]["status"], out["model_fault"]["http_status"]) == ("http_error", 429)


def test_stale_keepalive_connection_is_replaced(out):
    assert out["close_idle"]["status"] == "ok"
    r = out["stale_next"]
    assert r["status"] == "ok" and not r["reused"] and r["opened"] == 2


def test_large_request_body(out):
    assert out["big_body"]["status"] == "ok" and out["big_body"]["n"] == 2


def test_connection_failures(out):
    assert out["refused"]["status"] == "connection_error" and not out["refused"]["sent"]
    assert out["no_answer"]["status"] == "timeout" and out["no_answer"]["sent"]
    r = out["connect_timeout"]
    assert (r["status"], r["error"], r["sent"]) == ("connection_error", "connect timeout", False)


def test_kill_returns_cancelled_and_keeps_partial_times(out):
    r = out["cancelled"]
    assert r["status"] == "cancelled" and r["sent"], r
    assert 0 < r["n"] < 50 and r["monotone"]
    assert out["after_cancel"]["status"] == "ok"


def test_concurrent_streams_and_connection_cap(out):
    for wave in ("concurrent", "concurrent_reused"):
        rs = out[wave]
        assert len(rs) == 200 and all(r and r["status"] == "ok" and r["monotone"] for r in rs)
        assert all(r["n"] == r["completion_tokens"] == r["asked"] for r in rs)
    assert max(r["opened"] for r in out["concurrent_reused"]) <= 200
    assert sum(r["reused"] for r in out["concurrent_reused"]) >= 100
    capped = out["capped"]
    assert all(r and r["status"] == "ok" and r["n"] == 5 for r in capped)
    assert max(r["opened"] for r in capped) <= 2


def test_tls(out):
    if "tls" not in out:
        pytest.skip("openssl not available to make a test certificate")
    assert out["tls"]["status"] == "ok" and out["tls"]["n"] == 8 and out["tls"]["text"].startswith(" t0")
    assert out["tls_next"]["status"] == "ok" and out["tls_next"]["reused"]
    assert out["tls_untrusted"]["status"] == "connection_error" and "CERTIFICATE" in out["tls_untrusted"]["error"].upper()


def test_connect_time_only_where_a_connection_was_opened(out):
    first, reused = out["completions"], out["chat"]
    assert not first["reused"] and 0 < first["connect_s"] < wait_s(1)
    assert reused["reused"] and reused["connect_s"] is None
    assert all((r["connect_s"] is None) == r["reused"] for r in out["concurrent"] + out["concurrent_reused"])
    if "tls" in out:   # TCP connect + TLS handshake
        assert 0 < out["tls"]["connect_s"] < wait_s(2) and out["tls_next"]["connect_s"] is None


def test_preconnect_parks_connections_that_the_next_requests_reuse(out):
    pre = out["preconnect"]
    assert pre["opened"] == 5 and pre["error"] is None
    assert all(r["status"] == "ok" and r["reused"] and r["connect_s"] is None for r in pre["results"])
    assert max(r["opened"] for r in pre["results"]) == 5       # no request opened one of its own
    refused = out["preconnect_refused"]          # stops at the first failure: no 500 attempts
    assert refused["opened"] == 0 and "refused" in refused["error"].lower() and refused["took"] < wait_s(2)
    assert out["preconnect_late"][0] == 0 and "deadline" in out["preconnect_late"][1]
    if "tls_preconnect" in out:   # a TLS 1.3 server's session tickets do not make them look stale
        tp = out["tls_preconnect"]
        assert tp["opened"] == 2 and tp["total_opened"] == 2
        assert all(r["status"] == "ok" and r["reused"] and r["connect_s"] is None for r in tp["results"])
