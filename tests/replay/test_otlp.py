"""`replay run --otlp`: traceparent per request, the OTLP/HTTP span receiver, spans.parquet, and
`replay report RUN --spans FILE` (a collector's file export). Real HTTP on 127.0.0.1, real runs."""
from __future__ import annotations

import gzip
import json
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from llm_replay.replay.otlp import Receiver, traceparent
from tests.conftest import free_port, run_cli
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
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as r:
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
        assert urllib.request.urlopen(req, timeout=10).status == 200
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
