"""`replay run --otlp`: W3C trace context per request, and an OTLP/HTTP receiver for the server's spans.

Each request carries `traceparent: 00-<trace id>-<parent id>-01` derived from the run id and the
request id (so any process of a distributed run derives the same ids, and a record's trace_id is
reproducible); the server (vLLM with --otlp-traces-endpoint) exports one `llm_request` span per
request in that trace. The receiver runs in the `replay run` parent process (a thread there, never
in the gevent runner, whose hub it would stall), stores the spans and, after the run, waits for the
stragglers (a BatchSpanProcessor exports every 5 s) and writes spans.parquet; the counts go into
run.json `otlp`. Spans are joined by trace id and consistency (spans.resolve): one that does not
match, or contradicts its record, is counted, never joined. Anyone who can reach the port can post
spans: with a token (`--otlp-token`) a post without `Authorization: Bearer TOKEN` is refused (401).
Every post is bounded (spans.MAX_BODY, compressed and inflated; spans.MAX_SPANS kept), and a client
that hangs up costs a count, never a traceback.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llm_replay.reports.schema import RECORD_SCHEMA
from llm_replay.reports.spans import (MAX_BODY, MAX_SPANS, SPANS_FILE, TooLarge, decode_json, decode_protobuf, f64,
                                      gunzip, loads, once, own_trace_ids, resolve, to_table, traceparent, write_spans)

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


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Receiver:
    """An OTLP/HTTP trace receiver (protobuf or JSON, optionally gzipped) in a daemon thread."""

    CHUNK = 8192   # rows kept as tuples before they become an Arrow table (memory on long runs)

    def __init__(self, host: str, port: int, token: str | None = None) -> None:
        self.token = token
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(4)   # posts inflated and decoded at once (memory)
        self.rows: list[tuple] = []
        self.parts: list = []        # pyarrow tables of earlier rows
        self.trace_ids: set[str] = set()
        self.spans = self.other = self.kept = self.over_limit = self.bad_posts = self.unauthorized = 0
        self.last_bad: str | None = None
        self.server = ThreadingHTTPServer((host, port), _handler(self))   # OSError: address in use
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, client_address: None   # a client that hung up: counted
        self.address = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def add(self, body: bytes, ctype: str) -> None:
        now = time.time()
        rows, other = decode_json(loads(body), now) if "json" in ctype else decode_protobuf(body, now)
        with self.lock:
            self.spans += len(rows) + other
            self.other += other
            room = max(0, MAX_SPANS - self.kept)
            if len(rows) > room:
                self.over_limit += len(rows) - room
                rows = rows[:room]
            self.kept += len(rows)
            self.rows += rows
            self.trace_ids.update(r[0] for r in rows)
            if len(self.rows) >= self.CHUNK:
                self.parts.append(to_table(self.rows))
                self.rows = []

    def bad(self, why: str) -> str:
        with self.lock:
            self.bad_posts += 1
            self.last_bad = why[:200]
        return self.last_bad

    def tables(self) -> list:
        with self.lock:
            return self.parts + [to_table(self.rows)]

    def finish(self, run_dir: str | Path, wait_s: float, info: dict) -> dict:
        """Wait until every ok traced request of the run has a credible span, or `wait_s` after the
        last request ended; then write spans.parquet and return run.json's `otlp` counts."""
        path, t0 = Path(run_dir) / "records.parquet", info.get("t0_wall")
        cols = ["trace_id", "status", "sent_s", "first_token_s", "end_s", "prompt_tokens", "completion_tokens"]
        t = pq.read_table(path, columns=cols) if path.exists() else RECORD_SCHEMA.empty_table().select(cols)
        tid = t.column("trace_id").combine_chunks()
        ok = np.asarray(pc.fill_null(pc.equal(t.column("status"), "ok"), False).to_numpy(zero_copy_only=False))
        sent = f64(t.column("sent_s"))
        client = {"ttft_s": f64(t.column("first_token_s")) - sent, "e2e_s": f64(t.column("end_s")) - sent,
                  **{k: f64(t.column(k)) for k in ("prompt_tokens", "completion_tokens")}}
        last_end = pc.max(t.column("end_s")).as_py()
        traced = tid.is_valid().to_numpy(zero_copy_only=False)
        ok &= traced
        want = set(tid.filter(pa.array(ok)).to_pylist())
        deadline = (t0 or time.time()) + (last_end or 0.0) + wait_s
        began, check = time.time(), 0.0
        try:
            while time.time() < deadline:
                with self.lock:
                    arrived = want <= self.trace_ids
                if arrived and time.time() >= check:   # every one has a span: are they credible?
                    check = time.time() + 0.5
                    if (resolve(tid, client, once(self.tables()))[0][ok] >= 0).all():
                        break
                time.sleep(0.05)
        except KeyboardInterrupt:   # Ctrl-C: stop waiting, keep what came
            pass
        waited = time.time() - began
        self.server.shutdown()
        self.server.server_close()
        spans = once(self.tables())
        row, rejected, counts = resolve(tid, client, spans)
        stid = spans.column("trace_id")
        late = pc.sum(pc.greater(spans.column("received_s"), deadline)).as_py() or 0
        own = own_trace_ids((info.get("config") or {}).get("run_id"))
        n_own = pc.sum(pc.is_in(stid, pa.array(sorted(own), pa.string()))).as_py() or 0
        unmatched = spans.num_rows - (pc.sum(pc.is_in(stid, tid.drop_null())).as_py() or 0) - n_own
        n = write_spans([spans], path.parent / SPANS_FILE, t0) if t0 else 0
        missing = traced & (row < 0) & ~rejected
        out = {"endpoint": f"http://{self.address}{PATH}", "authenticated": self.token is not None,
               "spans": self.spans, "request_spans": n, "other_spans": self.other, "bad_posts": self.bad_posts,
               "unauthorized": self.unauthorized, "over_limit": self.over_limit, "wait_s": wait_s,
               "waited_s": round(waited, 3), "late": late, "traced": int(traced.sum()),
               "matched": int((traced & (row >= 0)).sum()), "missing": int(missing.sum()),
               "missing_ok": int((missing & ok).sum()), **counts, "unmatched": unmatched, "own": n_own,
               "deadline_s": round(deadline - t0, 6) if t0 else None}
        if self.last_bad:
            out["last_bad_post"] = self.last_bad
        return out


def _handler(rec: Receiver):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive: exporters reuse their connection
        timeout = 60                    # a client that stops sending frees its thread

        def do_POST(self) -> None:
            ctype = (self.headers.get("Content-Type") or "application/x-protobuf").lower()
            size = self.headers.get("Content-Length") or "0"
            if not size.isdigit() or int(size) > MAX_BODY or "chunked" in (self.headers.get("Transfer-Encoding") or ""):
                self.close_connection = True   # the body is never read
                why = rec.bad(f"Content-Length {size[:20]}: at most {MAX_BODY >> 20} MiB, chunked bodies unsupported")
                return self._reply(413 if size.isdigit() else 400, ctype, why)
            size = int(size)
            authorized = rec.token is None or hmac.compare_digest(
                (self.headers.get("Authorization") or "").encode(), f"Bearer {rec.token}".encode())
            if self.path.split("?")[0] != PATH or not authorized:   # its body is dropped unkept
                while size > 0 and (chunk := self.rfile.read(min(size, 1 << 16))):
                    size -= len(chunk)
                if authorized:
                    return self._reply(404, ctype, f"no such path {self.path}; spans go to {PATH}")
                with rec.lock:
                    rec.unauthorized += 1
                return self._reply(401, ctype, "Authorization: Bearer TOKEN required (replay run --otlp-token)")
            body = self.rfile.read(size)
            if len(body) < size:    # the client hung up mid-post: no one to answer
                rec.bad("the client hung up before its body was sent")
                self.close_connection = True
                return
            try:
                with rec.slots:
                    if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                        body = gunzip(body)
                    rec.add(body, ctype)
            except TooLarge as e:
                return self._reply(413, ctype, rec.bad(str(e)))
            except Exception as e:  # noqa: BLE001 - a bad post is counted and answered, never fatal
                return self._reply(400, ctype, rec.bad(f"{type(e).__name__}: {e}"))
            self._reply(200, ctype)

        def _reply(self, code: int, ctype: str, error: str | None = None) -> None:
            # an empty ExportTraceServiceResponse in the request's encoding, or a google.rpc.Status (JSON
            # only: its message is for a person) with UNAUTHENTICATED, RESOURCE_EXHAUSTED or INVALID_ARGUMENT
            json_ = "json" in ctype
            body = b"" if not json_ else b"{}" if error is None else \
                json.dumps({"code": {401: 16, 413: 8}.get(code, 3), "message": error}).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json" if json_ else "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            except OSError:   # the client hung up before its answer
                self.close_connection = True

        def log_message(self, *args) -> None:   # quiet: the run's counts say what happened
            pass

    return Handler
