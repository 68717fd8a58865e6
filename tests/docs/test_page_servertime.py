"""docs/servertime.md, every block as written (mdblocks.py: how): engine-stub, with the same flag
and environment variable, in place of `vllm serve MODEL`; free local ports for 8000 and 4318;
the collector of the page's otelcol.yaml is played by a small OTLP/HTTP server here that
appends each export to the file the YAML names, as the collector's `file` exporter does (OTLP/JSON,
ids in hex), and `vllm:8000` is an engine-stub exporting to it. The page's outputs are checked
against the runs its own blocks make."""
from __future__ import annotations

import base64
import json
import re
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest
import yaml

from llm_replay.reports.spans import own_trace_ids

from tests.conftest import free_port, wait_s
from tests.docs.mdblocks import DOCS, Page, background, commands, sh, stop, substitute, wait_http

PAGE = Page(DOCS / "servertime.md", {
    "pip install opentelemetry-sdk": "test_vllm_block",
    "replay trace generate --preset bursty": "test_vllm_block",
    "replay: otlp:": "test_vllm_block",
    "engine-stub serve --port 8000 --num-blocks 24": "test_compare_note",
    "# otelcol.yaml": "test_collector_blocks",
    "# --otlp send: the headers only": "test_collector_blocks",
    "slowest 1% TTFT (mean": "test_headline",
    "# slo.yaml": "test_gate_blocks",
    "replay gate runs/small-kv --slo slo.yaml": "test_gate_blocks",
    "regressed: among the requests at or above": "test_compare_note",
})
PAGES = [PAGE]
block = PAGE.block


def test_every_block_is_checked():
    PAGE.assert_checked(globals())


def _engine(cmd: str, cwd, log, subs: dict[str, str]):
    """A page's engine line (env assignments, trailing `&` allowed) on free ports: (process, URL)."""
    port = free_port()
    cmd = substitute(cmd, subs | {"--port 8000": f"--port {port}"} if "--port 8000" in cmd else subs)
    if "--port" not in cmd:
        cmd += f" --port {port}"
    proc = background("env " + cmd.split("#")[0].strip().rstrip("&").strip(), cwd, log)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc=proc, log=log)
    return proc, url


def _replay(cmd: str, url: str, otlp: int, cwd) -> str:
    p = sh(substitute(cmd, {"http://127.0.0.1:8000": url, "--otlp ": f"--otlp 127.0.0.1:{otlp} "}), cwd, timeout=300)
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-servertime")


@pytest.fixture(scope="module")
def traced(work):
    """The vLLM section: engine-stub started as vLLM is, then the page's replay block -> runs/traced."""
    pytest.importorskip("torch")
    pip, serve_line = commands(block("pip install opentelemetry-sdk").text)
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp"} <= set(pip.split("#")[0].split())
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf" in serve_line and "--otlp-traces-endpoint" in serve_line
    otlp = free_port()
    proc, url = _engine(serve_line, work, work / "engine-vllm.log",
                        {"vllm serve MODEL": "engine-stub serve", "127.0.0.1:4318": f"127.0.0.1:{otlp}"})
    generate, run = commands(block("replay trace generate --preset bursty").text)
    try:
        sh(generate, work)
        out = _replay(run, url, otlp, work)
    finally:
        stop(proc)
    return out


@pytest.fixture(scope="module")
def small_kv(work, traced):
    """The engine-stub section: a small KV cache, the same replay, `replay compare`."""
    serve_line, run, compare = commands(block("engine-stub serve --port 8000 --num-blocks 24").text)
    otlp = free_port()
    proc, url = _engine(serve_line, work, work / "engine-small.log", {"127.0.0.1:4318": f"127.0.0.1:{otlp}"})
    try:
        _replay(run, url, otlp, work)
    finally:
        stop(proc)
    p = sh(compare, work, ok=(0, 1))
    return " ".join((p.stdout + p.stderr).split())


@pytest.mark.slow
def test_vllm_block(work, traced):
    run = work / "runs" / "traced"
    o = json.loads((run / "run.json").read_text())["otlp"]
    rows = pq.read_metadata(work / "trace.parquet").num_rows
    assert o["traced"] == o["matched"] == rows and o["missing"] == o["unmatched"] == o["late"] == 0, o
    rec = pq.read_table(run / "records.parquet").to_pandas()
    spans = pq.read_table(run / "spans.parquet").to_pandas()
    own = own_trace_ids(json.loads((run / "run.json").read_text())["config"]["run_id"])  # probe, warm-ups
    assert o["own"] > 0 and set(spans.trace_id) - own == set(rec.trace_id)
    assert rec.trace_id.str.fullmatch("[0-9a-f]{32}").all()
    assert (spans.name == "llm_request").all()
    shown = block("replay: otlp:").text
    assert shown in traced.splitlines(), traced[-3000:]


@pytest.mark.slow
def test_headline(work, small_kv):
    shape = (r"slowest 1% TTFT \(mean \d+ ms\) = net \d+ \+ queue \d+ \+ prefill \d+ \+ other \d+ ms; "
             r"\S+ UTC queueing behind a full KV cache \(.*queue \d+% of TTFT\)")
    real = json.loads((work / "runs" / "small-kv" / "summary.json").read_text())["server_time"]["sentence"]
    shown = block("slowest 1% TTFT (mean").text
    assert re.fullmatch(shape, shown) and re.match(shape, real), real


@pytest.mark.slow
def test_compare_note(small_kv):
    shape = r"ttft_ms\.p(\d+) regressed: among the requests at or above their p\1, queue grew most \(\d+ -> \d+ ms, "
    shown = block("regressed: among the requests at or above").text
    assert re.match(shape, shown) and re.search(shape, small_kv), small_kv[-3000:]


@pytest.mark.slow
def test_gate_blocks(work, small_kv):
    spec = block("# slo.yaml").text
    assert yaml.safe_load(spec)["objectives"]
    (work / "slo.yaml").write_text(spec + "\n")
    gate = commands(block("replay gate runs/small-kv --slo slo.yaml").text)[0]
    out = sh(gate, work, ok=(1,)).stdout
    assert re.search(r"^\s*queue_ms\.p90 <= 200\b.*\bfail\b", out, re.M), out
    bare = work / "runs" / "no-spans"                  # the same run without its spans
    shutil.copytree(work / "runs" / "small-kv", bare)
    (bare / "spans.parquet").unlink()
    out = sh("replay gate runs/no-spans --slo slo.yaml", work, ok=(1, 2)).stdout     # 1: when ttft_ms.p90 fails
    assert re.search(r"^\s*queue_ms\.p90 <= 200\b.*cannot evaluate", out, re.M), out
    (work / "queue-only.yaml").write_text("objectives: ['queue_ms.p90 <= 200']\n")
    out = sh("replay gate runs/no-spans --slo queue-only.yaml", work, ok=(2,)).stdout
    assert "no server spans (run with --otlp)" in " ".join(out.split()), out


class _Collector(BaseHTTPRequestHandler):
    """The collector's otlp receiver + file exporter: each export one OTLP/JSON line, ids in hex."""
    path_out = None

    def do_POST(self):
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        req = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
        doc = MessageToDict(req)
        for rs in doc.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if k in s:
                            s[k] = base64.b64decode(s[k]).hex()
        with open(self.path_out, "a") as f:
            f.write(json.dumps(doc) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_collector_blocks(work, traced):
    cfg = yaml.safe_load(block("# otelcol.yaml").text)
    assert cfg["service"]["pipelines"]["traces"] == {"receivers": ["otlp"], "exporters": ["file"]}
    endpoint, path = cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"], cfg["exporters"]["file"]["path"]
    text = block("# --otlp send: the headers only").text
    run, report = commands(text)
    assert f"--spans {path}" in report
    out = work / "spans.jsonl"
    collector_port = free_port()
    handler = type("Handler", (_Collector,), {"path_out": str(out)})
    server = ThreadingHTTPServer(("127.0.0.1", collector_port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    assert endpoint.endswith(":4318")
    proc, url = _engine(f"engine-stub serve --otlp-traces-endpoint http://127.0.0.1:{collector_port}/v1/traces",
                        work, work / "engine-collected.log", {})
    try:
        p = sh(substitute(run, {"http://vllm:8000": url}), work, timeout=300)
        assert "replay: otlp:" not in p.stdout + p.stderr   # no receiver: nothing to count at the run's end
        rows = pq.read_metadata(work / "trace.parquet").num_rows
        deadline = time.monotonic() + wait_s(30)                    # engine-stub exports every 0.5 s
        while time.monotonic() < deadline and not (out.exists() and out.read_text().count('"llm_request"') >= rows):
            time.sleep(0.3)
    finally:
        stop(proc)
        server.shutdown()
    sh(substitute(report, {path: str(out)}), work)
    run_dir = work / "runs" / "collected"
    st = json.loads((run_dir / "summary.json").read_text())["server_time"]["counts"]
    assert st["traced"] == st["joined"] == pq.read_metadata(work / "trace.parquet").num_rows, st
    assert st["unmatched"] == st["duplicate"] == 0 and st["spans"] == st["joined"] + st["own"], st  # own: the probe's
    spans = pq.read_table(run_dir / "spans.parquet")
    assert spans.num_rows == st["spans"] and spans.column("received_s").null_count == spans.num_rows
