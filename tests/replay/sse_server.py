"""Small fast OpenAI-compatible SSE server for tests and benchmarks, with injectable faults.

    python3 -m tests.replay.sse_server --port 0 [--tokens 16] [--interval 0.005] [--fault MODE]
    -> prints `sse-server ready: http://127.0.0.1:PORT`

Streams `max_tokens` (or --tokens) content events on /v1/completions and /v1/chat/completions,
plus a usage chunk when `stream_options.include_usage` is set (or --usage). Raw asyncio
protocol with `call_later` per step (no task per request) so one process serves thousands of
events per second. A fault is chosen per request by the `X-Fault` header or a model named
`fault:MODE`, else by --fault (applied to every --fault-every'th request). Per-request `X-Interval` / `X-Tokens` headers
override the flags. With --stamp-log FILE it writes `request_id index before_ns after_ns` for each
token event: `perf_counter_ns` just before and just after its write, and index -1 when the whole
request had been read, -2 for the response's final write (request id: `X-Request-Id` header or the body's `user`; with `--stamp-id
prompt` the prompt text, characters other than word ones and `.:-` as `_`, so a client that sends
neither can be joined on its trace's `prompt` column). perf_counter is CLOCK_MONOTONIC on Linux.
`--conn-log FILE` appends one line (the peer address) per accepted connection. `--reset-route PATH`
answers 200 to a POST there (a cache reset, logged in --request-log); `--metrics` serves a /metrics
page with vLLM's prefix-cache query counter and the process start time.
`--otlp URL` posts (protobuf, batched every 0.2 s, from a thread) one vLLM-shaped `llm_request` span per
streamed request, in the trace of its `traceparent` header (a new trace without one; `--otlp-foreign`:
always a new one, as a server that ignores the header), with gen_ai.latency.* from its own clock
(queue 0), plus one start-up span without request attributes.

Reasoning and tool calls (chat only), as vLLM streams them: `--reasoning N` (or `X-Reasoning: N`)
makes the first N of the `max_tokens` events reasoning deltas (`--reasoning-field reasoning_content`
or `reasoning`), the rest the answer; `--tool-calls` (or `X-Tool-Call: 1`) streams the answer as one
tool call (a chunk with its name, then its arguments in pieces); `--report-reasoning` adds
`completion_tokens_details.reasoning_tokens` to the usage. `--first-delay S` (`X-First-Delay`)
delays the first token event (prefill) instead of `--interval`. A model named `bad-event:DATA` gets an event
`data: DATA` after its second token event. `--chat-only` answers 404 on
/v1/completions, `--html` a 200 HTML page to everything, `--no-images` 400 to image parts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import ssl
import time

FAULTS = ("http500", "http429", "stall", "drop", "malformed", "error_in_stream", "done_early",
          "trailers", "split", "coalesce", "crlf", "comments", "close_idle", "identity", "no_done",
          "empty", "gzip", "done_only")
CLOSE, STALL = object(), object()


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


class Stream(asyncio.Protocol):
    def __init__(self, server: "Server") -> None:
        self.srv, self.buf, self.busy, self.tr = server, b"", False, None

    def connection_made(self, tr) -> None:
        self.tr = tr
        sock = tr.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.srv.conn_log is not None:   # one line per accepted connection: its peer
            self.srv.conn_log.write(f"{tr.get_extra_info('peername')}\n")
            self.srv.conn_log.flush()

    def connection_lost(self, exc) -> None:
        self.tr = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.next_request()

    def next_request(self) -> None:
        i = self.buf.find(b"\r\n\r\n")
        if i < 0:
            return
        lines = self.buf[:i].decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        n = int(hdrs.get("content-length", 0))
        if len(self.buf) < i + 4 + n:
            return
        body, self.buf = self.buf[i + 4:i + 4 + n], self.buf[i + 4 + n:]
        self.busy = True
        method, path = lines[0].split(" ")[:2]
        self.srv.handle(self, method, path, hdrs, body)

    def run(self, steps, stamps=None) -> None:
        """Write (delay, data) steps; data may be CLOSE or STALL; stamps logs content writes."""
        for delay, data, idx in steps:
            if self.tr is None or self.tr.is_closing():
                return
            if delay > 0:
                asyncio.get_running_loop().call_later(delay, self._resume, delay, data, idx, steps, stamps)
                return
            if not self._write(data, idx, stamps):
                return
        self.busy = False
        if self.buf:
            self.next_request()

    def _resume(self, delay, data, idx, steps, stamps) -> None:
        if self.tr is not None and self._write(data, idx, stamps):
            self.run(steps, stamps)

    def _write(self, data, idx, stamps) -> bool:
        if data is CLOSE:
            self.tr.close()
            return False
        if data is STALL:
            return False
        if idx is not None and stamps is not None:   # the write happens between the two stamps
            stamps += (idx, time.perf_counter_ns())
            self.tr.write(data)
            stamps.append(time.perf_counter_ns())
        else:
            self.tr.write(data)
        return True


class Server:
    def __init__(self, args) -> None:
        self.a, self.count, self.queries, self.started = args, 0, 0, time.time()
        self.log = open(args.stamp_log, "a") if args.stamp_log else None
        self.requests = open(args.request_log, "a") if args.request_log else None
        self.conn_log = open(args.conn_log, "a") if args.conn_log else None
        self.spans = SpanPoster(args.otlp, args.otlp_foreign) if args.otlp else None

    def handle(self, conn: Stream, method: str, path: str, hdrs: dict, body: bytes) -> None:
        self.count += 1
        a = self.a
        if a.html:      # a URL that reaches a web page, not an API (a login page, a dashboard)
            page = b"<!doctype html><html><head><title>Sign in</title></head><body>Sign in</body></html>"
            return conn.run(iter([(0, self.head(200, "text/html; charset=utf-8", len(page)) + page, None)]))
        if a.chat_only and path.startswith("/v1/completions"):   # as FastAPI answers an unknown route
            err = b'{"detail":"Not Found"}'
            return conn.run(iter([(0, self.head(404, "application/json", len(err)) + err, None)]))
        if a.api_key and hdrs.get("authorization") != f"Bearer {a.api_key}":   # as OpenAI answers a bad key
            err = b'{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}'
            return conn.run(iter([(0, self.head(401, "application/json", len(err)) + err, None)]))
        if method == "GET" and path == "/metrics" and a.metrics:   # vLLM's counter: prompt tokens looked up
            text = (f"process_start_time_seconds {self.started}\n"
                    f"vllm:prefix_cache_queries_total {self.queries}\n").encode()
            return conn.run(iter([(0, self.head(200, "text/plain; version=0.0.4", len(text)) + text, None)]))
        if method == "POST" and path == a.reset_route:   # as vLLM's /reset_prefix_cache, SGLang's /flush_cache
            self.log_request({"path": path})
            return conn.run(iter([(0, self.head(200, "application/json", 0), None)]))
        if method == "GET":
            card = {"id": a.model, "object": "model", **({"max_model_len": a.max_model_len} if a.max_model_len else {})}
            data = json.dumps({"object": "list", "data": [card]}).encode()
            return conn.run(iter([(0, self.head(200, "application/json", len(data)) + data, None)]))
        try:
            req = json.loads(body)
        except ValueError:
            req = None
        if path not in ("/v1/completions", "/v1/chat/completions") or not isinstance(req, dict):
            err = json.dumps({"error": {"message": f"bad request to {path}", "code": 400}}).encode()
            return conn.run(iter([(0, self.head(400, "application/json", len(err)) + err, None)]))
        if a.no_images and any(isinstance(m.get("content"), list) and any(
                isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"])
                for m in req.get("messages") or () if isinstance(m, dict)):   # a text-only model, as vLLM answers
            err = json.dumps({"error": {"message": "The model does not support image inputs", "code": 400}}).encode()
            return conn.run(iter([(0, self.head(400, "application/json", len(err)) + err, None)]))
        model = str(req.get("model", ""))
        refusal = self.refuse(req, model)
        if refusal:
            return conn.run(iter([(0, self.head(refusal[0], "application/json", len(refusal[1])) + refusal[1], None)]))
        self.queries += self.prompt_tokens(req, path)
        msgs = [m for m in req.get("messages") or () if isinstance(m, dict)]
        self.log_request({"model": model, "max_tokens": req.get("max_tokens"), "path": path, "user": req.get("user"),
                          "messages": [[m.get("role"), str(m.get("content"))[:200]] for m in msgs]})
        fault = (hdrs.get("x-fault") or (model[6:] if model.startswith("fault:") else "")
                 or (a.fault if a.fault and self.count % a.fault_every == 0 else ""))
        n = int(hdrs.get("x-tokens") or req.get("max_tokens") or a.tokens)
        interval = float(hdrs.get("x-interval", a.interval))
        rid = hdrs.get("x-request-id") or str(req.get("user", self.count))
        if a.stamp_id == "prompt":   # the prompt (or last chat message) as the id, one word
            msgs = req.get("messages") or [{}]
            text = req.get("prompt") if "prompt" in req else msgs[-1].get("content") if isinstance(msgs[-1], dict) else ""
            rid = re.sub(r"[^\w.:-]", "_", str(text))[:200] or rid
        now = time.perf_counter_ns()
        stamps = [-1, now, now] if self.log else None    # index -1: the request was read
        mode = {"reasoning": int(hdrs.get("x-reasoning", a.reasoning)), "field": a.reasoning_field,
                "tool": bool(int(hdrs.get("x-tool-call", a.tool_calls))), "report": a.report_reasoning,
                "first": float(hdrs.get("x-first-delay", a.first_delay if a.first_delay is not None else interval)),
                "bad": model[10:].encode() if model.startswith("bad-event:") else None}
        steps = self.steps(req, path, fault, n, interval, stamps, rid, mode)
        if self.spans is not None and req.get("stream"):
            steps = self.spans.traced(steps, hdrs.get("traceparent"), rid, self.prompt_tokens(req, path), n)
        conn.run(steps, stamps)

    def log_request(self, entry: dict) -> None:
        if self.requests is not None:
            self.requests.write(json.dumps(entry) + "\n")
            self.requests.flush()

    def prompt_tokens(self, req: dict, path: str) -> int:
        chat = path.endswith("chat/completions")
        prompt = req.get("prompt") if not chat else " ".join(str(m.get("content", "")) for m in req.get("messages", []))
        n = len(prompt) if isinstance(prompt, list) else len(str(prompt or "").split())
        return n + (self.a.chat_template_tokens if chat else 0)

    def refuse(self, req: dict, model: str) -> tuple[int, bytes] | None:
        """vLLM's answers to an unknown model (--strict-model) and a request longer than the
        context (--max-model-len), in its error envelope."""
        a = self.a
        if a.strict_model and model != a.model:
            msg, code = f"The model `{model}` does not exist.", 404
        elif a.max_model_len:
            p = req.get("prompt") if "prompt" in req else " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            need = (len(p) if isinstance(p, list) else len(str(p or "").split())) + int(req.get("max_tokens") or 0)
            if need <= a.max_model_len:
                return None
            msg, code = (f"This model's maximum context length is {a.max_model_len} tokens. However, you "
                         f"requested {need} tokens. Please reduce the length of the input."), 400
        else:
            return None
        return code, json.dumps({"object": "error", "message": msg, "type": "BadRequestError", "code": code}).encode()

    def head(self, status: int, ctype: str, length: int | None, extra: str = "") -> bytes:
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
                  500: "Internal Server Error"}[status]
        framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
        return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n{framing}\r\n{extra}\r\n").encode()

    def token_bodies(self, chat: bool, n: int, mode: dict) -> list[bytes]:
        """The part of each token event after `"index":0,`: reasoning deltas, then the answer
        (text, content, or a tool call's name and then its arguments in pieces)."""
        n_reason = min(n, mode["reasoning"]) if chat else 0
        out = [b'"delta":{"%s":"%s"}' % (mode["field"].encode(), json.dumps(f" r{i}")[1:-1].encode())
               for i in range(n_reason)]
        n_answer = n - n_reason
        if chat and mode["tool"] and n_answer:
            args = ['{"city": "'] + [f" t{i}" for i in range(n_answer - 2)] + ['"}']
            out.append(b'"delta":{"tool_calls":[{"id":"chatcmpl-tool-5e1f","type":"function","index":0,'
                       b'"function":{"name":"get_weather"}}]}')
            out += [b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":"%s"}}]}'
                    % json.dumps(x)[1:-1].encode() for x in args[:n_answer - 1]]
            return out
        for i in range(n_answer):
            piece = json.dumps(f" t{i}")[1:-1].encode()
            out.append((b'"delta":{"content":"%s"}' if chat else b'"text":"%s","logprobs":null') % piece)
        return out

    def steps(self, req: dict, path: str, fault: str, n: int, interval: float, stamps, rid: str, mode: dict):
        if fault in ("http500", "http429"):
            code = int(fault[4:])
            err = json.dumps({"error": {"message": f"injected {code}", "type": "server_error", "code": code}}).encode()
            yield 0, self.head(code, "application/json", len(err), "Retry-After: 1\r\n" if code == 429 else "") + err, None
            return
        chat = path.endswith("chat/completions")
        model = json.dumps(str(req.get("model", self.a.model)))
        n_prompt = self.prompt_tokens(req, path)
        if not req.get("stream"):
            yield from self.whole(chat, model, n, n_prompt)
            return
        if fault == "empty":       # 200 text/event-stream and nothing in it: no data, no [DONE]
            yield 0, self.head(200, "text/event-stream", None) + b"0\r\n\r\n", None
            return
        if fault == "done_only":   # no token event, only [DONE]: "ok" with 0 tokens
            yield 0, self.head(200, "text/event-stream", None) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n", None
            return
        if fault == "gzip":        # a Content-Encoding the client never asked for
            import gzip
            body = gzip.compress(b"".join(b'data: {"choices":[{"index":0,"text":"x"}]}\n\n' for _ in range(n))
                                 + b"data: [DONE]\n\n")
            yield 0, self.head(200, "text/event-stream", len(body), "Content-Encoding: gzip\r\n") + body, None
            return
        nl, sep = (b"\r\n", b"\r\n\r\n") if fault == "crlf" else (b"\n", b"\n\n")
        close = b"Connection: close\r\n" if fault == "identity" else b""
        head = self.head(200, "text/event-stream", None).replace(b"Transfer-Encoding: chunked\r\n", b"") \
            if fault == "identity" else self.head(200, "text/event-stream", None)
        yield 0, head[:-2] + close + b"\r\n", None
        frame = (lambda b: b) if fault == "identity" else chunk
        pre = b'{"id":"cmpl-%s","object":"%s","created":0,"model":%s,"choices":[{"index":0,' % (
            rid.encode(), b"chat.completion.chunk" if chat else b"text_completion", model.encode())
        if chat:
            yield 0, frame(b"data: " + pre + b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}' + sep), None
        events = [b"data: " + pre + body + b',"finish_reason":null}]}' + sep for body in self.token_bodies(chat, n, mode)]
        if fault == "comments":
            events = [b": ping" + sep + b"event: completion" + nl + b"id: %d" % i + nl + e for i, e in enumerate(events)]
        for i, ev in enumerate(events):
            if mode["bad"] is not None and i == min(2, n - 1):   # that event's data, then the stream goes on
                yield interval, frame(b"data: " + mode["bad"] + sep), None
            if fault == "malformed" and i == min(2, n - 1):
                yield interval, frame(b'data: {"choices": [{"text": "broken' + sep), None
                return
            if fault == "error_in_stream" and i == min(2, n - 1):
                yield interval, frame(b'data: {"error": {"message": "injected engine failure", "code": 500}}' + sep), None
                break
            if fault in ("drop", "stall") and i == n // 2:
                yield interval, (CLOSE if fault == "drop" else STALL), None
                return
            if fault == "split":   # the event, and its chunk framing, in three writes and two chunks
                c = chunk(ev[:7]) + chunk(ev[7:])
                yield interval, c[:3], None
                yield 0.001, c[3:len(c) // 2], None
                yield 0.001, c[len(c) // 2:], i
            elif fault == "coalesce":   # three events per chunk, two chunks per write
                if i % 6 == 0:
                    group = events[i:i + 6]
                    yield interval, b"".join(chunk(b"".join(group[k:k + 3])) for k in (0, 3) if group[k:k + 3]), i
            else:
                yield mode["first"] if i == 0 else interval, frame(ev), i
        last = pre + (b'"delta":{},"finish_reason":"length"}]}' if chat else b'"text":"","logprobs":null,"finish_reason":"length"}]}')
        tail = frame(b"data: " + last + sep)
        so = req.get("stream_options") or {}
        if so.get("include_usage") or self.a.usage:
            details = b',"completion_tokens_details":{"reasoning_tokens":%d}' % (
                0 if self.a.report_reasoning_zero else min(n, mode["reasoning"])) \
                if chat and (mode["report"] or self.a.report_reasoning_zero) else b""
            tail += frame(b"data: " + pre[:pre.index(b'"choices"')] + b'"choices":[],"usage":{"prompt_tokens":%d,'
                          b'"total_tokens":%d,"completion_tokens":%d%s}}' % (n_prompt, n_prompt + n, n, details) + sep)
        if fault != "no_done":
            tail += frame(b"data: [DONE]" + sep)
        if fault == "identity":
            yield 0, tail, None
            yield 0, CLOSE, None
            return
        if fault == "done_early":   # [DONE] arrives well before the chunked terminator
            yield 0, tail, None
            yield 0.05, b"0\r\n\r\n", None
        else:   # index -2: the response's final write
            yield 0, tail + (b"0\r\nX-Trailer: yes\r\nX-Other: 1\r\n\r\n" if fault == "trailers" else b"0\r\n\r\n"), -2
        if stamps is not None and len(stamps) > 3:
            self.log.write("".join(f"{rid} {stamps[k]} {stamps[k + 1]} {stamps[k + 2]}\n"
                                   for k in range(0, len(stamps), 3)))
            self.log.flush()
        if fault == "close_idle":   # keep-alive promised, then closed while idle (a stale connection)
            yield 0.02, CLOSE, None

    def whole(self, chat: bool, model: str, n: int, n_prompt: int):
        text = "".join(f" t{i}" for i in range(n))
        choice = {"index": 0, "finish_reason": "length",
                  **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
        data = json.dumps({"id": "cmpl-0", "object": "chat.completion" if chat else "text_completion",
                           "created": 0, "model": json.loads(model), "choices": [choice],
                           "usage": {"prompt_tokens": n_prompt, "completion_tokens": n,
                                     "total_tokens": n_prompt + n}}).encode()
        yield 0, self.head(200, "application/json", len(data)) + data, None


class SpanPoster:
    """vLLM's request spans (same names and types), posted as OTLP/HTTP protobuf from a thread."""

    def __init__(self, url: str, foreign: bool) -> None:
        import queue
        import threading
        self.url, self.foreign, self.q = url, foreign, queue.Queue()
        now = time.time_ns()
        self.q.put(self.span(os.urandom(16), None, "Overall Loading", now - 10**9, now, {"load.time_s": 1.0}))
        threading.Thread(target=self.post_forever, daemon=True).start()

    def traced(self, steps, traceparent: str | None, rid: str, prompt_tokens: int, n: int):
        """`steps`, noting when each token event (index >= 0) and the final write (-2) go out: a
        step is written after its delay (call_later fires late, never early), so the stamps are not
        later than the writes, as vLLM's engine stamps come before its API server's writes. The
        span goes out when the response is done."""
        t0, wall0, first, last, end = time.perf_counter(), time.time_ns(), None, None, None
        for step in steps:
            t = time.perf_counter() + step[0]
            if step[2] is not None and step[2] >= 0:
                first, last = first or t, t
            elif step[2] == -2:
                end = t
            yield step
        end = end or time.perf_counter()
        first, last = first or end, last or end
        parts = (traceparent or "").split("-")
        tid, parent = (bytes.fromhex(parts[1]), bytes.fromhex(parts[2])) if len(parts) == 4 and not self.foreign \
            else (os.urandom(16), None)
        self.q.put(self.span(tid, parent, "llm_request", wall0, wall0 + int((end - t0) * 1e9), {
            "gen_ai.request.id": f"cmpl-{rid}", "gen_ai.usage.prompt_tokens": prompt_tokens,
            "gen_ai.usage.completion_tokens": n, "gen_ai.latency.time_in_queue": 0.0,
            "gen_ai.latency.time_to_first_token": first - t0, "gen_ai.latency.e2e": end - t0,
            "gen_ai.latency.time_in_model_prefill": first - t0, "gen_ai.latency.time_in_model_decode": last - first,
            "gen_ai.latency.time_in_model_inference": last - t0}))

    @staticmethod
    def span(tid: bytes, parent: bytes | None, name: str, start_ns: int, end_ns: int, attrs: dict):
        from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
        from opentelemetry.proto.trace.v1.trace_pb2 import Span

        def value(v):
            return AnyValue(string_value=v) if isinstance(v, str) else AnyValue(double_value=v) \
                if isinstance(v, float) else AnyValue(int_value=v)
        return Span(trace_id=tid, span_id=os.urandom(8), parent_span_id=parent or b"", name=name,
                    kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start_ns, end_time_unix_nano=end_ns,
                    attributes=[KeyValue(key=k, value=value(v)) for k, v in attrs.items()])

    def post_forever(self) -> None:
        import queue
        import urllib.request
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
        from opentelemetry.proto.resource.v1.resource_pb2 import Resource
        from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
        resource = Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value="sse-server"))])
        while True:
            batch = [self.q.get()]
            deadline = time.monotonic() + 0.2
            while (left := deadline - time.monotonic()) > 0:
                try:
                    batch.append(self.q.get(timeout=left))
                except queue.Empty:
                    break
            body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
                resource=resource, scope_spans=[ScopeSpans(spans=batch)])]).SerializeToString()
            for attempt in range(120):   # the receiver may not listen yet (start-up span): retry, then drop
                try:
                    urllib.request.urlopen(urllib.request.Request(
                        self.url, data=body, headers={"Content-Type": "application/x-protobuf"}), timeout=5).read()
                    break
                except OSError as e:
                    if attempt == 119:
                        print(f"sse-server: span export to {self.url} failed: {e}", flush=True)
                    time.sleep(0.5)


async def serve(args) -> None:
    ctx = None
    if args.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*args.tls)
    srv = Server(args)
    server = await asyncio.get_running_loop().create_server(lambda: Stream(srv), args.host, args.port,
                                                            ssl=ctx, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"sse-server ready: {'https' if ctx else 'http'}://{args.host}:{port}", flush=True)
    await server.serve_forever()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="sse_server", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="sse-test")
    ap.add_argument("--tokens", type=int, default=16, help="content events when the request has no max_tokens")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds between content events")
    ap.add_argument("--fault", choices=FAULTS, help="fault for every --fault-every'th request")
    ap.add_argument("--fault-every", type=int, default=1)
    ap.add_argument("--usage", action="store_true", help="always send a usage chunk")
    ap.add_argument("--reasoning", type=int, default=0, help="chat: the first N token events are reasoning")
    ap.add_argument("--reasoning-field", default="reasoning_content", choices=("reasoning_content", "reasoning"))
    ap.add_argument("--report-reasoning", action="store_true", help="usage.completion_tokens_details.reasoning_tokens")
    ap.add_argument("--report-reasoning-zero", action="store_true", help="usage reports 0 reasoning tokens (SGLang)")
    ap.add_argument("--tool-calls", type=int, default=0, choices=(0, 1), help="chat: the answer is a streamed tool call")
    ap.add_argument("--first-delay", type=float, help="seconds before the first token event (default --interval)")
    ap.add_argument("--chat-only", action="store_true", help="404 on /v1/completions, as chat-only gateways")
    ap.add_argument("--html", action="store_true", help="answer every request with a 200 HTML page")
    ap.add_argument("--no-images", action="store_true", help="400 for chat requests with image parts")
    ap.add_argument("--stamp-log", help="append 'request_id index before_ns after_ns' per content event write")
    ap.add_argument("--stamp-id", choices=("request", "prompt"), default="request",
                    help="--stamp-log's request id: X-Request-Id / body user (default), or the prompt text")
    ap.add_argument("--request-log", help="append a JSON line (model, max_tokens, path, user, chat messages as [role, "
                    "content[:200]]) per completion request, and {path} per cache reset")
    ap.add_argument("--reset-route", metavar="PATH", help="answer 200 to POST PATH (a cache reset)")
    ap.add_argument("--metrics", action="store_true", help="GET /metrics: process_start_time_seconds and "
                    "vllm:prefix_cache_queries_total (the prompt tokens served)")
    ap.add_argument("--api-key", help="answer 401 unless the request carries `Authorization: Bearer KEY`")
    ap.add_argument("--conn-log", help="append a line (the peer address) per accepted connection")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--chat-template-tokens", type=int, default=0, help="chat prompts count this many more tokens")
    ap.add_argument("--strict-model", action="store_true", help="404 for a model other than --model (as vLLM)")
    ap.add_argument("--max-model-len", type=int, help="list it in /v1/models; 400 for longer requests (as vLLM)")
    ap.add_argument("--cpu", type=int, help="pin this process to one CPU (benchmarks)")
    ap.add_argument("--otlp", metavar="URL", help="post a span per request to this OTLP/HTTP endpoint (.../v1/traces)")
    ap.add_argument("--otlp-foreign", action="store_true", help="--otlp: ignore traceparent (spans in new traces)")
    args = ap.parse_args(argv)
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
