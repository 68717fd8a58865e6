"""Server spans (OTLP traces) -> span rows -> spans.parquet (SPANS_SCHEMA).

Decodes an OTLP `ExportTraceServiceRequest` as protobuf bytes or as OTLP/JSON (whose trace and
span ids are hex strings, which protobuf's json_format would read as base64), keeps the spans
that carry a request's latencies (`gen_ai.latency.*`, vLLM's `llm_request`) and counts the others
(start-up spans such as "Overall Loading"). Also reads an OpenTelemetry collector's `file`
exporter output (JSON lines, optionally gzipped) for `replay report RUN --spans FILE`. Every input
is bounded (MAX_BODY per post or line, decompressed; MAX_SPANS request spans), so a gzip bomb,
`/dev/zero` or deeply nested JSON is one refusal, not a host out of memory.

`resolve` joins spans to records by trace id and consistency: a span whose durations contradict
the client's view of the same request cannot be that request's, whoever posted it.

A row is a tuple in SPANS_SCHEMA order with start_s/end_s/received_s as wall-clock epochs;
`write_spans` makes them relative to the run's t0_wall.
"""
from __future__ import annotations

import base64
import gzip
import json
import zlib
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


# A post or a --spans line (an OTLP export request) decompressed: vLLM's exporter sends batches of
# at most 512 spans (~1 MB), a collector's file exporter writes one export request per line.
MAX_BODY = 32 << 20
MAX_FILE = 8 << 30         # bytes of a --spans file, decompressed
MAX_SPANS = 2_000_000      # request spans kept per run (about 200 bytes each in Arrow)
# Consistency: the server's durations lie inside the client's (it stamps arrival after the send
# and the first token before it is written), and queue + prefill inside its TTFT. Durations only,
# so no clock offset enters; the tolerance covers clock rate (NTP slews <= 0.05%) and rounding.
TOL_S, TOL_REL = 0.001, 0.005


class TooLarge(ValueError):
    """An input over a bound (HTTP 413 in the receiver)."""


def gunzip(data: bytes, cap: int = MAX_BODY) -> bytes:
    """gzip bytes (every member) inflated, refused once they pass `cap` bytes: a bomb costs `cap`."""
    out, n = [], 0
    while data:
        d = zlib.decompressobj(31)
        try:
            chunk = d.decompress(data, cap + 1 - n)
        except zlib.error as e:
            raise ValueError(f"not gzip data: {e}") from None
        n += len(chunk)
        out.append(chunk)
        if n > cap:
            raise TooLarge(f"more than {cap >> 20} MiB when decompressed")
        if not d.eof:
            raise ValueError("truncated gzip data")
        data = d.unused_data
    return b"".join(out)


def loads(text: bytes | str):
    """json.loads with nesting too deep for Python a ValueError, like any other bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def own_trace_ids(run_id: str | None) -> set[str]:
    return {traceparent(run_id, r)[1] for r in OWN_REQUESTS} if run_id else set()


LATENCY = {"gen_ai.latency.time_in_queue": "queue_s", "gen_ai.latency.time_to_first_token": "ttft_s",
           "gen_ai.latency.e2e": "e2e_s", "gen_ai.latency.time_in_model_prefill": "prefill_s",
           "gen_ai.latency.time_in_model_decode": "decode_s",
           "gen_ai.latency.time_in_model_inference": "inference_s"}
WANTED = {**LATENCY, "gen_ai.request.id": "server_request_id", "gen_ai.usage.prompt_tokens": "prompt_tokens",
          "gen_ai.usage.completion_tokens": "completion_tokens"}
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
            if col in _INTS and not 0 <= row[_AT[col]] < 2**31:   # int32 in spans.parquet
                raise ValueError(f"gen_ai.usage.{col} {v} is out of range")
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
    try:
        raw = bytes.fromhex(value) if len(value) == 2 * size else base64.b64decode(value, validate=True)
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
        service = next((_json_value(a.get("value")) for a in _list(rs.get("resource") or {}, "attributes")
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


def read_collector_file(path: str | Path) -> tuple[list[pa.Table], int]:
    """The spans of an OpenTelemetry collector `file` exporter's output (one OTLP/JSON export
    request per line; `.gz` or gzip bytes accepted), as span tables. Lines without resourceSpans
    (metrics, logs) are skipped. Read as a stream within MAX_BODY a line, MAX_FILE and MAX_SPANS.
    Raises ReportError `FILE line N: why`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        f = gzip.open(path, "rb") if gz else open(path, "rb")
    except OSError as e:
        raise ReportError(f"cannot read spans: {e.strerror or e}", file=path) from None
    parts, rows, other, n, size = [], [], 0, 0, 0
    with f:
        try:
            while line := f.readline(MAX_BODY + 1):
                n += 1
                size += len(line)
                if len(line) > MAX_BODY or size > MAX_FILE:
                    raise ReportError(f"longer than {MAX_BODY >> 20} MiB" if len(line) > MAX_BODY else
                                      f"the file passes {MAX_FILE >> 30} GiB (decompressed)",
                                      file=f"{path} line {n}")
                if not line.strip():
                    continue
                try:
                    r, o = decode_json(loads(line))
                except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError) as e:
                    why = f"not JSON ({e})" if isinstance(e, json.JSONDecodeError) else str(e)
                    raise ReportError(f"{why[:200]} (expected the OTel collector file exporter's "
                                      "OTLP/JSON lines)", file=f"{path} line {n}") from None
                rows += r
                other += o
                if len(rows) >= 8192:
                    parts.append(to_table(rows))
                    rows = []
                if sum(p.num_rows for p in parts) + len(rows) > MAX_SPANS:
                    raise ReportError(f"more than {MAX_SPANS:,} request spans: export one run's time span "
                                      "only", file=f"{path} line {n}")
        except (OSError, EOFError, zlib.error) as e:
            raise ReportError(f"cannot read: {e}", file=f"{path} line {n + 1}") from None
    return parts + [to_table(rows)], other


def to_table(rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [() for _ in COLUMNS]
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SPANS_SCHEMA)], schema=SPANS_SCHEMA)


def once(parts: list[pa.Table]) -> pa.Table:
    """Span tables as one, a span delivered twice (an exporter's retry: same trace and span id) once."""
    t = pa.concat_tables(parts) if parts else to_table([])
    key = pc.binary_join_element_wise(t.column("trace_id"), pc.fill_null(t.column("span_id"), ""), "/")
    _, first = np.unique(key.to_numpy(zero_copy_only=False).astype(str), return_index=True)
    return t.take(np.sort(first))


def f64(col) -> np.ndarray:
    """An Arrow column as float64, null -> NaN."""
    return np.asarray(pc.fill_null(col.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False), float)


def write_spans(parts: list[pa.Table], path: str | Path, t0_wall: float) -> int:
    """Write span tables (wall-clock times) as spans.parquet with times relative to `t0_wall`,
    each span once. Returns the rows written."""
    t = once(parts)
    for name in ("start_s", "end_s", "received_s"):
        t = t.set_column(_AT[name], SPANS_SCHEMA.field(name), pc.subtract(t.column(name), t0_wall))
    tmp = Path(path).with_suffix(".parquet.tmp")
    pq.write_table(t, tmp, compression="zstd")
    tmp.replace(path)
    return t.num_rows


def import_spans(run_dir: str | Path, src: str | Path) -> dict:
    """`replay report RUN --spans FILE`: a collector's file export -> RUN/spans.parquet."""
    info_path = Path(run_dir) / "run.json"
    try:
        t0 = json.loads(info_path.read_text()).get("t0_wall")
    except (OSError, ValueError):
        t0 = None
    if not isinstance(t0, (int, float)):
        raise ReportError("--spans needs the run's t0_wall (a run directory written by `replay run`)", file=info_path)
    parts, other = read_collector_file(src)
    n = write_spans(parts, info_path.with_name(SPANS_FILE), t0)
    return {"file": str(src), "request_spans": n, "other_spans": other}


def resolve(trace_id: pa.Array, client: dict[str, np.ndarray], spans: pa.Table) -> tuple[np.ndarray, np.ndarray, dict]:
    """Join spans to records by trace id and consistency. `client`: per record its ttft_s, e2e_s,
    prompt_tokens and completion_tokens (NaN: unknown). A span is impossible when it contradicts
    itself (a negative duration, queue + prefill above its TTFT, TTFT above its E2E) or its record
    (server TTFT or E2E above the client's, other token counts). Among a record's possible spans,
    copies with equal values are one (the first in `spans` order is kept); two that differ leave
    it unjoined. Arrival order never decides which is believed. Returns (per record: its row in
    `spans` or -1, per record: spans came but none was credible, counts `duplicate` (spans beyond
    one per trace id of the run), `impossible` (spans of the run's trace ids), `rejected` (records))."""
    n = len(trace_id)
    valid = np.flatnonzero(trace_id.is_valid().to_numpy(zero_copy_only=False))
    idx = pc.index_in(spans.column("trace_id"), value_set=trace_id.take(pa.array(valid, pa.int64())))
    idx = pc.fill_null(idx, -1).to_numpy(zero_copy_only=False)
    of = np.flatnonzero(idx >= 0)                      # spans of the run's records...
    rec = valid[idx[of]]                               # ...and their record
    s = {k: f64(spans.column(k))[of] for k in ("ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s",
                                               "prompt_tokens", "completion_tokens")}
    c = {k: np.asarray(v, float)[rec] for k, v in client.items()}

    def above(a, b):   # a exceeds b beyond the tolerance (unknown on either side: no)
        return a > b + TOL_S + TOL_REL * np.abs(b)
    with np.errstate(invalid="ignore"):
        lat = np.column_stack([s[k] for k in ("ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s")])
        bad = (np.isinf(lat) | (lat < -TOL_S)).any(axis=1)
        bad |= above(s["ttft_s"], c["ttft_s"]) | above(s["e2e_s"], c["e2e_s"]) | above(s["ttft_s"], s["e2e_s"])
        bad |= above(np.nan_to_num(s["queue_s"]) + np.nan_to_num(s["prefill_s"]), s["ttft_s"])
        bad |= above(s["decode_s"], s["e2e_s"])
        for k in ("prompt_tokens", "completion_tokens"):
            bad |= ~np.isnan(s[k]) & ~np.isnan(c[k]) & (s[k] != c[k])
    row, seen = np.full(n, -1, np.int64), np.zeros(n, bool)
    seen[rec] = True
    ok = ~bad
    values = np.column_stack([rec[ok]] + [s[k][ok] for k in s])
    values = np.where(np.isnan(values), -1e300, values)   # unknown == unknown
    distinct, first = np.unique(values, axis=0, return_index=True)
    ids = distinct[:, 0].astype(np.int64)                 # the record of each distinct credible span
    one = np.bincount(ids, minlength=n)[ids] == 1
    row[ids[one]] = of[ok][first[one]]
    rejected = seen & (row < 0)
    counts = {"duplicate": int(len(of) - seen.sum()), "impossible": int(bad.sum()), "rejected": int(rejected.sum())}
    return row, rejected, counts
