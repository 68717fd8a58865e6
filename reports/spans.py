"""Server spans (OTLP traces) -> span rows -> spans.parquet (SPANS_SCHEMA).

Decodes an OTLP `ExportTraceServiceRequest` as protobuf bytes or as OTLP/JSON (whose trace and
span ids are hex strings, which protobuf's json_format would read as base64), keeps the spans
that carry a request's latencies (`gen_ai.latency.*`, vLLM's `llm_request`) and counts the others
(start-up spans such as "Overall Loading"). Also reads an OpenTelemetry collector's `file`
exporter output (JSON lines, optionally gzipped) for `replay report RUN --spans FILE`.

A row is a tuple in SPANS_SCHEMA order with start_s/end_s/received_s as wall-clock epochs;
`write_spans` makes them relative to the run's t0_wall.
"""
from __future__ import annotations

import base64
import gzip
import json
from hashlib import blake2b
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import ReportError
from .schema import SPANS_SCHEMA

SPANS_FILE = "spans.parquet"
# The client's own requests outside the trace (the capability probe, warm-ups) are traced under
# these ids, so their spans are counted as the client's own, not as unmatched foreign traffic.
OWN_REQUESTS = ("probe", "warmup")


def traceparent(run_id: str, request_id: str) -> tuple[str, str]:
    """(traceparent header value, trace id) of a request: blake2b(run/request), 16 bytes trace id,
    8 bytes parent span id, flags 01 (sampled: vLLM's ParentBased sampler records only those)."""
    d = blake2b(f"{run_id}/{request_id}".encode(), digest_size=24).hexdigest()
    return f"00-{d[:32]}-{d[32:]}-01", d[:32]


def own_trace_ids(run_id: str | None) -> set[str]:
    return {traceparent(run_id, r)[1] for r in OWN_REQUESTS} if run_id else set()
LATENCY = {"gen_ai.latency.time_in_queue": "queue_s", "gen_ai.latency.time_to_first_token": "ttft_s",
           "gen_ai.latency.e2e": "e2e_s", "gen_ai.latency.time_in_model_prefill": "prefill_s",
           "gen_ai.latency.time_in_model_decode": "decode_s",
           "gen_ai.latency.time_in_model_inference": "inference_s"}
OTHER = {"gen_ai.request.id": "server_request_id", "gen_ai.usage.prompt_tokens": "prompt_tokens",
         "gen_ai.usage.completion_tokens": "completion_tokens"}
WANTED = {**LATENCY, **OTHER}
COLUMNS = SPANS_SCHEMA.names
_AT = {name: i for i, name in enumerate(COLUMNS)}
_INTS = {"prompt_tokens", "completion_tokens"}
_FLOATS = set(LATENCY.values())


def _row(trace_id: str, span_id: str, name: str, service: str | None, start_ns, end_ns,
         received: float | None, attrs: dict) -> tuple:
    row = [None] * len(COLUMNS)
    row[:7] = trace_id, span_id, name, service, int(start_ns) / 1e9, int(end_ns) / 1e9, received
    for col, v in attrs.items():
        if v is not None:
            row[_AT[col]] = int(v) if col in _INTS else float(v) if col in _FLOATS else str(v)
    return tuple(row)


def decode_protobuf(body: bytes, received: float | None = None) -> tuple[list[tuple], int]:
    """(span rows, spans without request latencies) of an ExportTraceServiceRequest; raises
    ValueError for bytes that are not one."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    try:
        msg = ExportTraceServiceRequest.FromString(body)
    except DecodeError as e:
        raise ValueError(f"not an OTLP ExportTraceServiceRequest (protobuf): {e}") from None
    rows, other = [], 0
    for rs in msg.resource_spans:
        service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), None)
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = {WANTED[a.key]: _pb_value(a.value) for a in s.attributes if a.key in WANTED}
                if not any(k in _FLOATS for k in attrs):
                    other += 1
                    continue
                rows.append(_row(s.trace_id.hex(), s.span_id.hex(), s.name, service, s.start_time_unix_nano,
                                 s.end_time_unix_nano, received, attrs))
    return rows, other


def _pb_value(v):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def _hex_id(value, size: int, what: str) -> str:
    """OTLP/JSON ids are hex; base64 (protobuf's own JSON mapping, some exporters) is accepted too."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a hex string, got {type(value).__name__}")
    if len(value) == 2 * size:
        try:
            return bytes.fromhex(value).hex()
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise ValueError(f"{what} {value[:40]!r} is not {2 * size} hex digits")
    return raw.hex()


def _json_value(v: dict):
    if not isinstance(v, dict) or not v:
        return None
    kind, x = next(iter(v.items()))
    if kind == "intValue":
        return int(x)         # int64 travels as a JSON string
    if kind == "doubleValue":
        return float(x)       # may be "NaN"/"Infinity" strings
    return x if kind in ("stringValue", "boolValue") else None


def decode_json(obj, received: float | None = None) -> tuple[list[tuple], int]:
    """(span rows, spans without request latencies) of an OTLP/JSON ExportTraceServiceRequest;
    raises ValueError naming what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    rows, other = [], 0
    for rs in _list(obj, "resourceSpans"):
        res = rs.get("resource") or {}
        service = next((_json_value(a.get("value")) for a in _list(res, "attributes")
                        if a.get("key") == "service.name"), None)
        for ss in _list(rs, "scopeSpans") + _list(rs, "instrumentationLibrarySpans"):
            for s in _list(ss, "spans"):
                attrs = {WANTED[a["key"]]: _json_value(a.get("value")) for a in _list(s, "attributes")
                         if a.get("key") in WANTED}
                if not any(k in _FLOATS for k in attrs):
                    other += 1
                    continue
                try:
                    start, end = int(s.get("startTimeUnixNano") or 0), int(s.get("endTimeUnixNano") or 0)
                except (TypeError, ValueError):
                    raise ValueError("startTimeUnixNano/endTimeUnixNano must be integers") from None
                rows.append(_row(_hex_id(s.get("traceId"), 16, "traceId"), _hex_id(s.get("spanId"), 8, "spanId"),
                                 str(s.get("name", "")), service, start, end, received, attrs))
    return rows, other


def _list(obj: dict, key: str) -> list:
    v = obj.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise ValueError(f"{key} must be a list of objects")
    return v


def read_collector_file(path: str | Path) -> tuple[list[tuple], int]:
    """The spans of an OpenTelemetry collector `file` exporter's output (one OTLP/JSON export
    request per line; `.gz` or gzip bytes accepted). Lines without resourceSpans (metrics, logs)
    are skipped. Raises ReportError `FILE line N: why`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        f = gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot read spans: {e.strerror or e}", file=path) from None
    rows, other = [], 0
    with f:
        n = 0
        try:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r, o = decode_json(json.loads(line))
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    why = f"not JSON ({e})" if isinstance(e, json.JSONDecodeError) else str(e)
                    raise ReportError(f"{why[:200]} (expected the OTel collector file exporter's "
                                      "OTLP/JSON lines)", file=f"{path} line {n}") from None
                rows += r
                other += o
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise ReportError(f"cannot read: {e}", file=f"{path} line {n + 1}") from None
    return rows, other


def to_table(rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [() for _ in COLUMNS]
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SPANS_SCHEMA)], schema=SPANS_SCHEMA)


def write_spans(parts: list[pa.Table], path: str | Path, t0_wall: float) -> int:
    """Write span tables (wall-clock times) as spans.parquet with times relative to `t0_wall`;
    a span delivered twice (an exporter's retry) is kept once. Returns the rows written."""
    t = pa.concat_tables(parts) if parts else to_table([])
    if t.num_rows:
        key = pc.binary_join_element_wise(t.column("trace_id"), pc.fill_null(t.column("span_id"), ""), "/")
        _, first = np.unique(key.to_numpy(zero_copy_only=False).astype(str), return_index=True)
        t = t.take(np.sort(first))
    for name in ("start_s", "end_s", "received_s"):
        t = t.set_column(_AT[name], SPANS_SCHEMA.field(name), pc.subtract(t.column(name), t0_wall))
    tmp = Path(path).with_suffix(".parquet.tmp")
    pq.write_table(t, tmp, compression="zstd")
    tmp.replace(path)
    return t.num_rows


def import_spans(run_dir: str | Path, src: str | Path) -> dict:
    """`replay report RUN --spans FILE`: a collector's file export -> RUN/spans.parquet."""
    run_dir = Path(run_dir)
    info_path = run_dir / "run.json"
    try:
        t0 = json.loads(info_path.read_text()).get("t0_wall")
    except (OSError, ValueError):
        t0 = None
    if not isinstance(t0, (int, float)):
        raise ReportError("--spans needs the run's t0_wall (a run directory written by `replay run`)",
                          file=info_path)
    rows, other = read_collector_file(src)
    n = write_spans([to_table(rows)], run_dir / SPANS_FILE, t0)
    return {"file": str(src), "request_spans": n, "other_spans": other}
