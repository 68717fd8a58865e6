"""`replay run --otlp`: W3C trace context per request, and an OTLP/HTTP receiver for the server's spans.

Each request carries `traceparent: 00-<trace id>-<parent id>-01` derived from the run id and the
request id (so any process of a distributed run derives the same ids, and a record's trace_id is
reproducible); the server (vLLM with --otlp-traces-endpoint) exports one `llm_request` span per
request in that trace. The receiver runs in the `replay run` parent process (a thread there, never
in the gevent runner, whose hub it would stall), stores the spans and, after the run, waits for the
stragglers (a BatchSpanProcessor exports every 5 s) and writes spans.parquet; the counts go into
run.json `otlp`. Spans are joined by trace id only: one that does not match is counted, never guessed.
"""
from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path

from llm_replay.reports.spans import own_trace_ids, traceparent  # noqa: F401 (traceparent: re-exported)

DEFAULT = "127.0.0.1:4318"
PATH = "/v1/traces"


def header(run_id: str, request_id: str) -> tuple[bytes, str]:
    """The header line to splice into a request and its trace id."""
    value, trace_id = traceparent(run_id, request_id)
    return b"traceparent: %s\r\n" % value.encode(), trace_id


def parse_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--otlp {value!r}: expected HOST:PORT, e.g. {DEFAULT}")
    return host.strip("[]"), int(port)


class Receiver:
    """An OTLP/HTTP trace receiver (protobuf or JSON, optionally gzipped) in a daemon thread."""

    CHUNK = 8192   # rows kept as tuples before they become an Arrow table (memory on long runs)

    def __init__(self, host: str, port: int) -> None:
        from http.server import ThreadingHTTPServer
        self.lock = threading.Lock()
        self.rows: list[tuple] = []
        self.parts: list = []        # pyarrow tables of earlier rows
        self.trace_ids: set[str] = set()
        self.spans = self.other = self.bad_posts = 0
        self.last_bad: str | None = None
        self.server = ThreadingHTTPServer((host, port), _handler(self))   # OSError: address in use
        self.server.daemon_threads = True
        self.address = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def add(self, body: bytes, ctype: str) -> None:
        from llm_replay.reports.spans import decode_json, decode_protobuf, to_table
        now = time.time()
        rows, other = decode_json(json.loads(body), now) if "json" in ctype else decode_protobuf(body, now)
        with self.lock:
            self.rows += rows
            self.trace_ids.update(r[0] for r in rows)
            self.spans += len(rows) + other
            self.other += other
            if len(self.rows) >= self.CHUNK:
                self.parts.append(to_table(self.rows))
                self.rows = []

    def covered(self, want: set[str]) -> bool:
        with self.lock:
            return want <= self.trace_ids

    def finish(self, run_dir: str | Path, wait_s: float, info: dict) -> dict:
        """Wait until every ok traced request of the run has its span, or `wait_s` after the last
        request ended; then write spans.parquet and return run.json's `otlp` counts."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from llm_replay.reports.spans import SPANS_FILE, to_table, write_spans
        run_dir = Path(run_dir)
        t0 = info.get("t0_wall")
        traced, ok_traced, last_end = set(), set(), None
        path = run_dir / "records.parquet"
        if path.exists():
            t = pq.read_table(path, columns=["trace_id", "status", "end_s"])
            sent = t.filter(pc.is_valid(t.column("trace_id")))
            traced = set(sent.column("trace_id").to_pylist())
            ok_traced = set(sent.filter(pc.equal(sent.column("status"), "ok")).column("trace_id").to_pylist())
            last_end = pc.max(t.column("end_s")).as_py()
        deadline = (t0 or time.time()) + (last_end or 0.0) + wait_s
        began = time.time()
        try:
            while time.time() < deadline and not self.covered(ok_traced):
                time.sleep(0.05)
        except KeyboardInterrupt:   # Ctrl-C: stop waiting, keep what came
            pass
        waited = time.time() - began
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            parts = self.parts + [to_table(self.rows)]
            ids = set(self.trace_ids)
        late = sum(pc.sum(pc.greater(p.column("received_s"), deadline)).as_py() or 0 for p in parts)
        own = own_trace_ids((info.get("config") or {}).get("run_id"))
        known = pa.array(sorted(traced), pa.string())
        n_own = sum(pc.sum(pc.is_in(p.column("trace_id"), pa.array(sorted(own), pa.string()))).as_py() or 0
                    for p in parts)
        unmatched = sum(p.num_rows - (pc.sum(pc.is_in(p.column("trace_id"), known)).as_py() or 0)
                        for p in parts) - n_own
        n = write_spans(parts, run_dir / SPANS_FILE, t0) if t0 else 0
        out = {"endpoint": f"http://{self.address}{PATH}", "spans": self.spans, "request_spans": n,
               "other_spans": self.other, "bad_posts": self.bad_posts, "wait_s": wait_s,
               "waited_s": round(waited, 3), "late": late, "traced": len(traced),
               "matched": len(traced & ids), "missing": len(traced - ids),
               "missing_ok": len(ok_traced - ids), "unmatched": unmatched, "own": n_own,
               "deadline_s": round(deadline - t0, 6) if t0 else None}
        if self.last_bad:
            out["last_bad_post"] = self.last_bad
        return out


def _handler(rec: Receiver):
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive: exporters reuse their connection

        def do_POST(self) -> None:
            ctype = (self.headers.get("Content-Type") or "application/x-protobuf").lower()
            try:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.split("?")[0] != PATH:
                    return self._reply(404, ctype, f"no such path {self.path}; spans go to {PATH}")
                if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                    body = gzip.decompress(body)
                rec.add(body, ctype)
            except Exception as e:  # noqa: BLE001 - a bad post is counted and answered, never fatal
                with rec.lock:
                    rec.bad_posts += 1
                    rec.last_bad = f"{type(e).__name__}: {e}"[:200]
                return self._reply(400, ctype, rec.last_bad)
            self._reply(200, ctype)

        def _reply(self, code: int, ctype: str, error: str | None = None) -> None:
            json_ = "json" in ctype
            if error is None:   # an empty ExportTraceServiceResponse, in the request's encoding
                body = b"{}" if json_ else b""
            else:               # a google.rpc.Status (JSON only: its message is for a person)
                body = json.dumps({"code": 3, "message": error}).encode() if json_ else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json" if json_ else "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:   # quiet: the run's counts say what happened
            pass

    return Handler

