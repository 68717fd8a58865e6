"""--otlp-traces-endpoint on a real engine-stub subprocess: one vLLM-style `llm_request` span per
request, received over OTLP/HTTP by a receiver in the test; the `traceparent` header is honoured;
the latencies add up; queueing shows in time_in_queue; a dead endpoint never stops serving."""
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import free_port, run_cli, start_engine, wait_s

pytest.importorskip("torch")
trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from opentelemetry.proto.trace.v1.trace_pb2 import Span  # noqa: E402

LATENCIES = {f"gen_ai.latency.{k}" for k in ("time_in_queue", "time_to_first_token", "e2e", "time_in_model_prefill",
                                             "time_in_model_decode", "time_in_model_inference")}
TYPES = {"gen_ai.request.id": "string_value", "gen_ai.usage.prompt_tokens": "int_value",
         "gen_ai.usage.completion_tokens": "int_value", "gen_ai.response.finish_reasons": "string_value",
         **{k: "double_value" for k in LATENCIES}}
EPS = 1e-6  # seconds: float rounding of differences of perf_counter values


class Receiver:
    """A minimal OTLP/HTTP collector: decodes each ExportTraceServiceRequest, keeps its spans."""

    def __init__(self) -> None:
        self.spans: dict[str, tuple[Span, dict, str]] = {}   # gen_ai.request.id -> (span, attrs, service)
        self.paths: set[str] = set()
        self.auth: set[str | None] = set()   # the Authorization headers posted
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.paths.add((self.path, self.headers["Content-Type"]))
                outer.auth.add(self.headers.get("Authorization"))
                msg = trace_service.ExportTraceServiceRequest.FromString(body)
                for rs in msg.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            attrs = {a.key: (a.value.WhichOneof("value"), getattr(a.value, a.value.WhichOneof("value")))
                                     for a in s.attributes}
                            outer.spans[attrs["gen_ai.request.id"][1]] = (s, attrs, service)
                reply = trace_service.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, ids, timeout=wait_s(30.0)) -> dict:
        deadline = time.monotonic() + timeout   # a deadline for waiting, not an assertion on time
        while not set(ids) <= set(self.spans) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(ids) <= set(self.spans), f"spans never came: {set(ids) - set(self.spans)}"
        return {i: self.spans[i] for i in ids}


@pytest.fixture(scope="module")
def traced():
    receiver = Receiver()
    # the engine loop in its own process: its timestamps must still line up with the server's
    eng = start_engine("--model", "micro", "--max-num-seqs", "1", "--engine-process",
                       "--otlp-traces-endpoint", receiver.url)   # no path: /v1/traces is added
    yield eng.url, receiver
    eng.stop()
    receiver.server.shutdown()


def chat(url, headers=None, max_tokens=6):
    """A streaming chat request -> (response id, usage, unix ns before sending, unix ns after the answer)."""
    body = {"model": "micro", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    rid = usage = None
    before = time.time_ns()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=wait_s(60)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                rid, usage = event["id"], event.get("usage") or usage
    return rid, usage, before, time.time_ns()


def check_span(span, attrs, service, usage):
    assert service == "engine-stub" and span.name == "llm_request" and span.kind == Span.SPAN_KIND_SERVER
    assert {k: t for k, (t, _) in attrs.items()} == TYPES
    v = {k: x for k, (_, x) in attrs.items()}
    lat = {k.rsplit(".", 1)[1]: v[k] for k in LATENCIES}
    assert v["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert v["gen_ai.usage.completion_tokens"] == usage["completion_tokens"]
    assert all(x >= 0 for x in lat.values()), lat
    assert lat["time_in_queue"] + lat["time_in_model_prefill"] <= lat["time_to_first_token"] + EPS
    assert lat["time_to_first_token"] <= lat["e2e"] + EPS
    assert abs(lat["time_in_model_decode"] - (lat["e2e"] - lat["time_to_first_token"])) < EPS
    assert abs(lat["time_in_model_inference"] - lat["time_in_model_prefill"] - lat["time_in_model_decode"]) < EPS
    assert abs((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 - lat["e2e"]) < EPS
    return lat


def test_spans_honour_traceparent(traced):
    url, receiver = traced
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    sent = {
        "traced": chat(url, {"traceparent": f"00-{trace_id}-{parent}-01"}),
        "plain": chat(url),
        "zeros": chat(url, {"traceparent": f"00-{'0' * 32}-{parent}-01"}),   # invalid: a fresh trace
        "unsampled": chat(url, {"traceparent": f"00-{trace_id}-{parent}-00"}),
        "last": chat(url, {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}, max_tokens=3),
    }
    got = receiver.wait([v[0] for k, v in sent.items() if k != "unsampled"])
    assert sent["unsampled"][0] not in receiver.spans   # vLLM's ParentBased sampler: no span, nor here
    for key, (rid, usage, before, after) in sent.items():
        if key == "unsampled":
            continue
        span, attrs, service = got[rid]
        check_span(span, attrs, service, usage)
        # the engine process's clock and the server's map to the same unix time (5 ms: clock slew)
        assert before - 5e6 <= span.start_time_unix_nano <= span.end_time_unix_nano <= after + 5e6
    assert got[sent["traced"][0]][0].trace_id.hex() == trace_id
    assert got[sent["traced"][0]][0].parent_span_id.hex() == parent
    assert got[sent["last"][0]][0].trace_id.hex() == "ab" * 16
    for key in ("plain", "zeros"):
        span = got[sent[key][0]][0]
        assert len(span.trace_id) == 16 and span.trace_id != bytes(16) and span.parent_span_id == b""
    ids = {got[rid][0].trace_id for rid, _ in got.items()} | {got[rid][0].span_id for rid, _ in got.items()}
    assert len(ids) == 2 * len(got)   # fresh ids for every span and every untraced request
    assert receiver.paths == {("/v1/traces", "application/x-protobuf")}


def test_queueing_shows_in_time_in_queue(traced):
    """Three prompts in one completions request with --max-num-seqs 1: they arrive together and run one
    after another, so each later one is scheduled only after the previous one finished."""
    url, receiver = traced
    prompts = [[1000 + i + j for j in range(20)] for i in range(3)]
    r = httpx.post(url + "/v1/completions", timeout=wait_s(60), headers={"traceparent": f"00-{'12' * 16}-{'34' * 8}-01"},
                   json={"model": "micro", "prompt": prompts, "max_tokens": 24, "ignore_eos": True})
    assert r.status_code == 200
    rid = r.json()["id"]
    got = receiver.wait([f"{rid}-{i}" for i in range(3)])   # vLLM's ids of completions' prompts
    rows = []
    for span, attrs, service in got.values():
        lat = check_span(span, attrs, service, {"prompt_tokens": 20, "completion_tokens": 24})
        assert span.trace_id.hex() == "12" * 16 and span.parent_span_id.hex() == "34" * 8
        start, end = span.start_time_unix_nano / 1e9, span.end_time_unix_nano / 1e9
        scheduled = start + lat["time_to_first_token"] - lat["time_in_model_prefill"]
        rows.append((scheduled, scheduled - lat["time_in_queue"], end, lat["time_in_queue"]))
    rows.sort()
    assert len({round(start, 9) for start in (s.start_time_unix_nano for s, _, _ in got.values())}) == 1
    for (_, _, prev_end, _), (scheduled, queued, _, queue) in zip(rows, rows[1:]):
        assert scheduled >= prev_end - EPS      # one at a time
        assert queued < prev_end                # it was waiting while the previous one ran...
        assert queue >= prev_end - queued - EPS  # ...and all that wait is queue time
    assert rows[0][3] < rows[1][3] < rows[2][3]


def test_client_abort_is_traced(traced):
    url, receiver = traced
    body = {"model": "micro", "prompt": "abort me", "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=wait_s(60)) as r:
        rid = json.loads(next(line for line in r.iter_lines() if line.startswith("data: {"))[6:])["id"]
    span, attrs, _ = receiver.wait([rid + "-0"])[rid + "-0"]
    assert attrs["gen_ai.response.finish_reasons"][1] == '["abort"]'
    assert 1 <= attrs["gen_ai.usage.completion_tokens"][1] < 4000


def test_dead_endpoint_never_stops_serving():
    eng = start_engine("--model", "micro", "--otlp-traces-endpoint", f"http://127.0.0.1:{free_port()}/v1/traces")
    try:
        assert chat(eng.url)[1]["completion_tokens"] == 6
        deadline = time.monotonic() + wait_s(30)
        while not any("cannot export spans" in line for line in eng.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chat(eng.url)[1]["completion_tokens"] == 6   # after a failed export, still serving
    finally:
        eng.stop()
    deadline = time.monotonic() + wait_s(10)
    while not any("spans were not exported" in line for line in eng.log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum("cannot export spans" in line for line in eng.log) == 1, eng.log
    assert any("2 of 2 spans were not exported" in line for line in eng.log), eng.log


def test_hanging_endpoint_every_span_counted():
    """An endpoint that takes the connection and never answers: at exit each span is exported,
    failed or still unsent, and the counts add up to the requests served."""
    with socket.socket() as hang:
        hang.bind(("127.0.0.1", 0))
        hang.listen(64)   # connections wait in its backlog, never answered
        eng = start_engine("--model", "micro", "--otlp-traces-endpoint",
                           f"http://127.0.0.1:{hang.getsockname()[1]}/v1/traces")
        n = 5
        try:
            for _ in range(n):
                assert chat(eng.url)[1]["completion_tokens"] == 6
        finally:
            eng.stop()
        deadline = time.monotonic() + wait_s(30)
        while not any("spans were not exported" in line for line in eng.log) and time.monotonic() < deadline:
            time.sleep(0.05)
    line = next((line for line in eng.log if "spans were not exported" in line), None)
    m = re.search(r"(\d+) of (\d+) spans were not exported .*\((\d+) failed, (\d+) still unsent", line or "")
    assert m, eng.log
    assert int(m[1]) == int(m[2]) == n and int(m[3]) + int(m[4]) == n, line


def test_exporter_headers_from_the_environment(monkeypatch):
    """OTEL_EXPORTER_OTLP_HEADERS (as vLLM's exporter reads it) goes out with every post."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20s3cret,x-other=1")
    receiver = Receiver()
    eng = start_engine("--model", "micro", "--otlp-traces-endpoint", receiver.url)
    try:
        rid = chat(eng.url)[0]
        receiver.wait([rid])
    finally:
        eng.stop()
        receiver.server.shutdown()
    assert receiver.auth == {"Bearer s3cret"}


def test_endpoint_must_be_an_http_url():
    r = run_cli("engine_stub", "serve", "--port", "0", "--otlp-traces-endpoint", "localhost:4317", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: --otlp-traces-endpoint 'localhost:4317': expected http://"), r.stderr
