"""`--otlp-traces-endpoint`: one vLLM-style `llm_request` span per finished request, exported over
OTLP/HTTP (protobuf) by a background thread (server.parse_traceparent reads the parent from the request).

Attribute names, types and meanings are vLLM V1's (output_processor.do_tracing). The engine thread
only appends the finished request to a deque; spans are built and posted here every ~0.5 s, so a
slow or dead endpoint never delays a step: export errors are counted and reported once on stderr,
and at exit every span is accounted for (exported, failed, or still queued). Headers come from
OTEL_EXPORTER_OTLP_TRACES_HEADERS or OTEL_EXPORTER_OTLP_HEADERS, as for vLLM's exporter (e.g. the
`Authorization=Bearer%20TOKEN` that `replay run --otlp-token` requires).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import deque

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from .request import EngineRequest

SERVICE = "engine-stub"
_BATCH = 512  # spans per POST


def traces_url(endpoint: str) -> str:
    """The POST URL: the endpoint as given (as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), with /v1/traces
    added when it has no path. ValueError when it is not an http(s) URL."""
    u = urllib.parse.urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"--otlp-traces-endpoint {endpoint!r}: expected http://HOST:PORT[/v1/traces] "
                         "(OTLP over HTTP, protobuf)")
    return endpoint if u.path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


class SpanExporter:
    """Batches finished requests into ExportTraceServiceRequest POSTs (thread-safe `add`)."""

    def __init__(self, endpoint: str, interval: float = 0.5) -> None:
        self.url, self.interval = traces_url(endpoint), interval
        # exporter headers from the environment: `k=v,k2=v2`, URL-encoded (the OTel spec's form)
        raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
        pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
        self.headers = {urllib.parse.unquote(k).strip(): urllib.parse.unquote(v).strip() for k, v in pairs}
        self.added = self.exported = self.dropped = 0
        self._queue: deque[tuple[EngineRequest, float]] = deque()
        # perf_counter -> unix time, once: span times stay consistent with the latencies they carry
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def add(self, req: EngineRequest, finished: float) -> None:
        """A request that has finished (or was aborted after being scheduled) at `finished`."""
        self.added += 1
        self._queue.append((req, finished))

    def close(self, timeout: float = 1.0) -> None:
        """Flush what is queued (giving a dead endpoint at most `timeout` seconds) and stop."""
        self._stop.set()
        self._thread.join(timeout + 1)
        exported, dropped = self.exported, self.dropped
        pending = self.added - exported - dropped   # queued, or in a post a hanging endpoint never answered
        if dropped or pending:
            print(f"engine-stub: {dropped + pending} of {self.added} spans were not exported to {self.url} "
                  f"({dropped} failed, {pending} still unsent at exit)", file=sys.stderr, flush=True)

    def _run(self) -> None:
        resource = Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value=SERVICE))])
        scope = InstrumentationScope(name=SERVICE)
        while True:
            stopping = self._stop.wait(self.interval)
            while self._queue:
                spans = []
                while self._queue and len(spans) < _BATCH:
                    spans.append(self._span(*self._queue.popleft()))
                body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
                    resource=resource, scope_spans=[ScopeSpans(scope=scope, spans=spans)])]).SerializeToString()
                self._post(body, len(spans), 1.0 if stopping else 5.0)
            if stopping:
                return

    def _post(self, body: bytes, n: int, timeout: float) -> None:
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={**self.headers, "Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                r.read()
            self.exported += n
        except Exception as e:  # noqa: BLE001 - any failure to export must not stop serving
            if not self.dropped:
                print(f"engine-stub: warning: cannot export spans to {self.url}: {e} (spans are dropped; "
                      "serving goes on)", file=sys.stderr, flush=True)
            self.dropped += n

    def _span(self, req: EngineRequest, finished: float) -> Span:
        request_id, trace_id, parent_id = req.trace
        scheduled, first, last = req.first_scheduled_time, req.first_token_time, req.last_token_time
        # vLLM V1's definitions; a request aborted before its first token has no TTFT, prefill or decode
        # (vLLM would subtract a zero timestamp): those attributes are left out, never guessed
        latency = {"e2e": finished - req.arrival_time, "time_in_queue": scheduled - req.queued_time}
        if first is not None:
            latency.update(time_to_first_token=first - req.arrival_time, time_in_model_prefill=first - scheduled,
                           time_in_model_decode=last - first, time_in_model_inference=last - scheduled)
        attrs = [KeyValue(key="gen_ai.request.id", value=AnyValue(string_value=request_id)),
                 KeyValue(key="gen_ai.usage.prompt_tokens", value=AnyValue(int_value=req.num_prompt_tokens)),
                 KeyValue(key="gen_ai.usage.completion_tokens", value=AnyValue(int_value=req.num_output_tokens)),
                 KeyValue(key="gen_ai.response.finish_reasons",
                          value=AnyValue(string_value=json.dumps([req.finish_reason])))]
        attrs += [KeyValue(key=f"gen_ai.latency.{k}", value=AnyValue(double_value=v)) for k, v in latency.items()]
        return Span(trace_id=bytes.fromhex(trace_id) if trace_id else os.urandom(16), span_id=os.urandom(8),
                    parent_span_id=bytes.fromhex(parent_id) if parent_id else b"", name="llm_request",
                    kind=Span.SPAN_KIND_SERVER, attributes=attrs,
                    start_time_unix_nano=self._offset_ns + round(req.arrival_time * 1e9),
                    end_time_unix_nano=self._offset_ns + round(finished * 1e9))
