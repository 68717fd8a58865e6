"""`replay run --otlp`: traceparent per request, the OTLP/HTTP span receiver, spans.parquet, and
`replay report RUN --spans FILE` (a collector's file export). Real HTTP on 127.0.0.1, real runs."""
from __future__ import annotations

import gzip
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from llm_replay.replay.otlp import Receiver, traceparent
from tests.conftest import free_port, repo_env, run_cli, wait_s
from tests.replay.runkit import records, replay_run, run_info, sse_server, write_trace

N = 24


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("otlp")
    port = free_port()
    trace = write_trace(d / "t.parquet", N, gap_s=0.01)
    with sse_server("--otlp", f"http://127.0.0.1:{port}/v1/traces", "--interval", "0.002", "--usage") as url:
        replay_run(trace, url, d / "run", "--otlp", f"127.0.0.1:{port}")
    return d / "run"


def test_every_ok_record_joins_exactly_one_span(traced_run):
    recs, info = records(traced_run), run_info(traced_run)
    spans = pq.read_table(traced_run / "spans.parquet").to_pandas()
    ok = recs[recs.status == "ok"]
    assert len(ok) == N
    # trace ids derive from the run's id and the request id, as sent in traceparent
    run_id = info["config"]["run_id"]
    assert list(ok.trace_id) == [traceparent(run_id, rid)[1] for rid in ok.request_id]
    assert spans.trace_id.is_unique and set(spans.trace_id) == set(ok.trace_id)
    j = ok.merge(spans, on="trace_id", suffixes=("", "_srv"))
    assert len(j) == N and (j.name == "llm_request").all() and (j.service == "sse-server").all()
    # the server's own durations fit inside the client's view of the same request
    assert (j.ttft_s <= j.first_token_s - j.sent_s).all()
    assert (j.e2e_s <= j.end_s - j.sent_s).all()
    assert (j.completion_tokens_srv == 6).all() and (j.prompt_tokens_srv == 20).all() and (j.queue_s == 0).all()
    assert j.received_s.notna().all()
    o = info["otlp"]
    assert (o["traced"], o["matched"], o["missing"], o["unmatched"], o["bad_posts"]) == (N, N, 0, 0, 0)
    assert o["request_spans"] == N and o["other_spans"] == 1   # the start-up span is counted, not a row


def test_spans_of_other_traces_are_never_joined(tmp_path):
    """A server that ignores traceparent: its spans are counted unmatched, the records missing."""
    port = free_port()
    trace = write_trace(tmp_path / "t.parquet", 8, gap_s=0.01)
    with sse_server("--otlp", f"http://127.0.0.1:{port}/v1/traces", "--otlp-foreign") as url:
        replay_run(trace, url, tmp_path / "run", "--otlp", f"127.0.0.1:{port}", "--otlp-wait", "1")
    o = run_info(tmp_path / "run")["otlp"]
    assert (o["traced"], o["matched"], o["missing"], o["missing_ok"]) == (8, 0, 8, 8)
    assert o["unmatched"] == 8 and o["request_spans"] == 8
    spans = pq.read_table(tmp_path / "run" / "spans.parquet").column("trace_id").to_pylist()
    assert not set(spans) & set(records(tmp_path / "run").trace_id)


def test_untraced_run_records_null_trace_ids(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 4)
    with sse_server() as url:
        replay_run(trace, url, tmp_path / "run")
    assert records(tmp_path / "run").trace_id.isna().all()
    assert "otlp" not in run_info(tmp_path / "run") and not (tmp_path / "run" / "spans.parquet").exists()


def test_port_in_use_is_one_line_error(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 2)
    with socket.socket() as s, sse_server() as url:
        s.bind(("127.0.0.1", 0))
        s.listen()
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        r = replay_run(trace, url, tmp_path / "run", "--otlp", addr, check=False)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and addr in lines[-1] and "--otlp HOST:PORT" in lines[-1]
    assert "HOST:0" in lines[-1]   # how a second run at once gets its own port
    assert not (tmp_path / "run" / "records.parquet").exists()


# An OTLP/JSON export as a collector's file exporter writes it: hex ids, int64 as strings.
TID = "0af7651916cd43dd8448eb211c80319c"
EXPORT = {"resourceSpans": [{
    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm.llm_engine"}}]},
    "scopeSpans": [{"scope": {"name": "vllm.llm_engine"}, "spans": [
        {"traceId": TID, "spanId": "b7ad6b7169203331", "name": "llm_request", "kind": 2,
         "startTimeUnixNano": "1700000000500000000", "endTimeUnixNano": "1700000001750000000",
         "attributes": [{"key": "gen_ai.request.id", "value": {"stringValue": "cmpl-7"}},
                        {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "512"}},
                        {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "64"}},
                        {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 0.25}},
                        {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.4}},
                        {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1.25}},
                        {"key": "gen_ai.latency.time_in_model_prefill", "value": {"doubleValue": 0.125}},
                        {"key": "gen_ai.latency.time_in_model_decode", "value": {"doubleValue": 0.8}},
                        {"key": "gen_ai.latency.time_in_model_inference", "value": {"doubleValue": 0.925}}]},
        {"traceId": "1" * 32, "spanId": "2" * 16, "name": "Overall Loading",
         "startTimeUnixNano": "1699999990000000000", "endTimeUnixNano": "1699999999000000000"}]}]}]}


def _post(url: str, body: bytes, headers: dict) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=wait_s(10)) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_json_post_and_collector_file_give_the_same_spans(traced_run, tmp_path):
    t0 = 1700000000.0
    run = tmp_path / "run"
    shutil.copytree(traced_run, run)
    info = run_info(run)
    info["t0_wall"] = t0
    (run / "run.json").write_text(json.dumps(info))
    (run / "spans.parquet").unlink()

    # the receiver: gzipped OTLP/JSON, plus a body that is not OTLP
    rec = Receiver("127.0.0.1", 0)
    url = f"http://{rec.address}/v1/traces"
    code, body = _post(url, gzip.compress(json.dumps(EXPORT).encode()),
                       {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert (code, json.loads(body)) == (200, {})
    assert _post(url, b"\xff\xfe garbage", {"Content-Type": "application/x-protobuf"})[0] == 400
    got = tmp_path / "recv"
    got.mkdir()
    (got / "run.json").write_text(json.dumps({"t0_wall": t0}))
    o = rec.finish(got, 0.0, {"t0_wall": t0})
    assert (o["request_spans"], o["other_spans"], o["bad_posts"]) == (1, 1, 1)
    received = pq.read_table(got / "spans.parquet")

    # the same export as a collector's file: `replay report RUN --spans FILE`
    src = tmp_path / "export.jsonl"
    src.write_text(json.dumps(EXPORT) + "\n" + json.dumps({"resourceMetrics": []}) + "\n")
    r = run_cli("replay", "report", run, "--spans", src, "--no-write")
    assert r.returncode == 0, r.stderr
    from_file = pq.read_table(run / "spans.parquet")
    assert from_file.drop(["received_s"]).equals(received.drop(["received_s"]))
    assert from_file.column("received_s").null_count == 1 and received.column("received_s").null_count == 0
    row = from_file.to_pylist()[0]
    assert row["trace_id"] == TID and row["start_s"] == pytest.approx(0.5) and row["end_s"] == pytest.approx(1.75)
    assert (row["queue_s"], row["ttft_s"], row["prompt_tokens"], row["server_request_id"]) == (0.25, 0.4, 512, "cmpl-7")

    # a bad line: one `error:` line naming the file and the line, exit 2
    src.write_text(json.dumps(EXPORT) + "\n{not json\n")
    r = run_cli("replay", "report", run, "--spans", src, "--no-write")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and f"{src} line 2: not JSON" in r.stderr


def test_real_vllm_bodies_posted_to_the_receiver(tmp_path):
    """The bytes a real vLLM 0.32 exported (fixtures/vllm_otlp/README.md: what was sent), posted
    over HTTP: the 4 request spans keep the trace ids sent and vLLM's values; start-up spans are
    counted as other spans, not stored."""
    fix = Path(__file__).parent / "fixtures" / "vllm_otlp"
    rec = Receiver("127.0.0.1", 0)
    for name in ("startup.pb", "llm_request.pb"):
        req = urllib.request.Request(f"http://{rec.address}/v1/traces", data=(fix / name).read_bytes(),
                                     headers={"Content-Type": "application/x-protobuf"}, method="POST")
        assert urllib.request.urlopen(req, timeout=wait_s(10)).status == 200
    o = rec.finish(tmp_path, 0, {"t0_wall": 1796284037.0})
    assert (o["spans"], o["request_spans"], o["other_spans"], o["bad_posts"]) == (6, 4, 2, 0), o
    s = pq.read_table(tmp_path / "spans.parquet").to_pandas().sort_values("trace_id")
    assert s.trace_id.tolist() == [f"5eed0{i}00000000000000000000c0ffee" for i in range(1, 5)]
    assert s.prompt_tokens.tolist() == [101, 181, 261, 341] and s.completion_tokens.tolist() == [24, 32, 40, 48]
    first = s.iloc[0]
    assert first.server_request_id == "chatcmpl-bfa7b7db145aa6e2" and first["name"] == "llm_request"
    assert first.ttft_s == pytest.approx(0.20519328117370605, abs=1e-12)
    assert first.start_s == pytest.approx(1796284037425012480 / 1e9 - 1796284037.0, abs=1e-6)
    assert (s.inference_s - s.prefill_s - s.decode_s).abs().max() < 1e-6   # vLLM: inference = prefill + decode


def _forged_export(run_id: str, request_ids, span_id: str = "f" * 16) -> bytes:
    """Another process's spans with the run's trace ids (derivable from run.json's run id): queue 99 s."""
    spans = [{"traceId": traceparent(run_id, rid)[1], "spanId": span_id, "name": "llm_request",
              "startTimeUnixNano": "1", "endTimeUnixNano": "2",
              "attributes": [{"key": f"gen_ai.latency.{k}", "value": {"doubleValue": v}}
                             for k, v in (("time_in_queue", 99.0), ("time_to_first_token", 99.5), ("e2e", 100.0),
                                          ("time_in_model_prefill", 0.4), ("time_in_model_decode", 0.5))]}
             for rid in request_ids]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


class Forger(threading.Thread):
    """Posts forged spans as soon as the run's run.json names its run id (before any server span)."""

    def __init__(self, run_dir: Path, url: str, request_ids, headers: dict | None = None) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.url, self.ids, self.headers, self.codes = run_dir, url, request_ids, headers or {}, []
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + wait_s(60)   # a bound on waiting for the run, not a judgement of time
        while time.monotonic() < deadline:
            try:
                run_id = json.loads((self.run_dir / "run.json").read_text())["config"]["run_id"]
                break
            except (OSError, ValueError, KeyError):
                time.sleep(0.01)
        else:
            return
        for span_id in ("f" * 16, "e" * 16):
            self.codes.append(_post(self.url, _forged_export(run_id, self.ids, span_id),
                                    {"Content-Type": "application/json", **self.headers})[0])


def test_forged_spans_do_not_replace_the_servers(tmp_path):
    """No token: spans another process posts first with the run's trace ids are impossible beside
    the client's TTFT; they are counted and never joined, and the report says so."""
    port, n = free_port(), 8
    ids = [f"r{i}" for i in range(n)]
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.01, request_id=ids)
    with sse_server("--otlp", f"http://127.0.0.1:{port}/v1/traces", "--usage") as url:
        forger = Forger(tmp_path / "run", f"http://127.0.0.1:{port}/v1/traces", ids)
        r = replay_run(trace, url, tmp_path / "run", "--otlp", f"127.0.0.1:{port}")
        forger.join(30)
    assert forger.codes == [200, 200] and "unauthenticated" in r.stderr
    o = run_info(tmp_path / "run")["otlp"]
    assert (o["matched"], o["impossible"], o["duplicate"], o["rejected"], o["authenticated"]) == (n, 2 * n, 2 * n, 0,
                                                                                                False), o
    assert f"{2 * n} impossible spans" in r.stderr
    rep = run_cli("replay", "report", tmp_path / "run", "--force")
    assert rep.returncode == 0, rep.stderr
    st = json.loads((tmp_path / "run" / "summary.json").read_text())["server_time"]
    assert st["overall"]["queue_ms"]["p99"] == 0 and st["overall"]["net_ms"]["p50"] > 0
    assert st["counts"]["impossible"] == 2 * n and f"{2 * n} impossible server spans ignored" in st["sentence"]


def test_token_refuses_other_posters(tmp_path, monkeypatch):
    """With a token (REPLAY_OTLP_TOKEN, and the exporter's OTEL_EXPORTER_OTLP_HEADERS on engine-stub),
    posts without it are refused (401) and counted; the server's spans join."""
    pytest.importorskip("torch")
    from tests.conftest import start_engine
    port, n = free_port(), 6
    ids = [f"r{i}" for i in range(n)]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20s3cret")
    monkeypatch.setenv("REPLAY_OTLP_TOKEN", "s3cret")
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.01, request_id=ids)
    eng = start_engine("--model", "micro", "--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces")
    try:
        forger = Forger(tmp_path / "run", f"http://127.0.0.1:{port}/v1/traces", ids,
                        {"Authorization": "Bearer guess"})
        r = replay_run(trace, eng.url, tmp_path / "run", "--otlp", f"127.0.0.1:{port}")
        forger.join(30)
    finally:
        eng.stop()
    assert forger.codes == [401, 401] and "(token required)" in r.stderr
    o = run_info(tmp_path / "run")["otlp"]
    assert (o["matched"], o["unauthorized"], o["impossible"], o["authenticated"]) == (n, 2, 0, True), o
    assert "s3cret" not in (tmp_path / "run" / "run.json").read_text()
    spans = pq.read_table(tmp_path / "run" / "spans.parquet")
    assert set(spans.column("service").to_pylist()) == {"engine-stub"}
    # beyond loopback, a receiver without a token is refused before the run
    monkeypatch.delenv("REPLAY_OTLP_TOKEN")
    r = replay_run(trace, eng.url, tmp_path / "open", "--otlp", "0.0.0.0:0", check=False)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: --otlp 0.0.0.0:0: beyond")


RECEIVER = """
import json, sys
from llm_replay.replay.otlp import Receiver
rec = Receiver("127.0.0.1", 0)
print(rec.address, flush=True)
sys.stdin.read()
o = rec.finish(sys.argv[1], 0, {"t0_wall": 1.7e9})
# VmHWM is this process image's own peak: ru_maxrss would carry the forking pytest worker's over exec
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"otlp": o, "maxrss_kb": hwm}), flush=True)
"""
MAXRSS_KB = 400 << 10   # the process with pyarrow and protobuf loaded is ~150 MB; the bomb inflates to 512 MiB


def _bomb() -> bytes:
    """~0.5 MB of gzip (64 members) that inflates to 512 MiB."""
    return gzip.compress(bytes(8 << 20), 9) * 64


def test_receiver_bounds_and_hang_ups(tmp_path):
    """A gzip bomb, a huge Content-Length, nested JSON and clients that hang up: each a counted bad
    post answered at once (or not at all), with the receiver's memory bounded and nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=repo_env())
    try:
        address = proc.stdout.readline().strip()
        url = f"http://{address}/v1/traces"
        code, body = _post(url, _bomb(), {"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert code == 413 and "MiB" in json.loads(body)["message"]
        assert _post(url, b"[" * 100_000 + b"]" * 100_000, {"Content-Type": "application/json"})[0] == 400
        huge = json.dumps(EXPORT).replace('"intValue": "512"', '"intValue": "99999999999"').encode()
        assert _post(url, huge, {"Content-Type": "application/json"})[0] == 400   # spans.parquet holds int32
        host, port = address.rsplit(":", 1)
        for raw, reset in ((b"POST /v1/traces HTTP/1.1\r\nContent-Length: 9999999999\r\n\r\n", False),  # too large
                           (b"POST /v1/traces HTTP/1.1\r\nContent-Length: 1000\r\n\r\nonly part", False),  # hangs up
                           (b"POST /v1/traces HTTP/1.1\r\nContent-Length: 3\r\n\r\nbad", True)):  # resets, unanswered
            with socket.create_connection((host, int(port)), timeout=wait_s(30)) as s:
                s.sendall(raw)
                if reset:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        assert _post(url, json.dumps(EXPORT).encode(), {"Content-Type": "application/json"})[0] == 200
        out, err = proc.communicate("", timeout=wait_s(60))
    finally:
        proc.kill()
    got = json.loads(out.splitlines()[-1])
    assert err == "", err
    # the reset post is counted when its bytes were read before the reset came (the kernel's race)
    assert got["otlp"]["bad_posts"] in (5, 6) and got["otlp"]["request_spans"] == 1, got["otlp"]
    assert got["maxrss_kb"] < MAXRSS_KB, got


def test_spans_file_bounds(tmp_path):
    """`--spans` reads a stream within bounds: a gzip bomb, /dev/zero and nested JSON are one
    `error:` line each, in bounded memory."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"t0_wall": 1.7e9}))
    bomb, nested = tmp_path / "bomb.jsonl.gz", tmp_path / "nested.jsonl"
    bomb.write_bytes(_bomb())
    nested.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    for src, why in ((bomb, "line 1: longer than 32 MiB"), ("/dev/zero", "line 1: longer than 32 MiB"),
                     (nested, "line 1: JSON nested too deeply")):
        wrapper = ("import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, "
                   "text=True); print(json.dumps([r.returncode, r.stderr, "
                   "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
        r = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "llm_replay.replay", "report",
                            str(run), "--spans", str(src), "--no-write"], capture_output=True, text=True,
                           env=repo_env(), timeout=wait_s(300))
        code, err, maxrss = json.loads(r.stdout)
        assert code == 2 and len(err.strip().splitlines()) == 1 and why in err, err
        assert err.startswith(f"error: {src} {why}") and maxrss < MAXRSS_KB, (err, maxrss)
