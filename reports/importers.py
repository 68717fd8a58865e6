"""Other tools' per-request results -> our records schema, so runs compare on one scale.

- vLLM `vllm bench serve --save-result --save-detailed`: one JSON object whose per-request lists
  are `input_lens`, `output_lens`, `ttfts` (s), `itls` (list of s per request), `errors`
  ("" = success), `generated_texts`, and in newer versions `start_times` (s, perf_counter).
- AIPerf `profile_export.jsonl` (shape read from ai-dynamo/aiperf: the record is `MetricRecordInfo`
  in src/aiperf/common/models/record_export_models.py, its metadata `MetricRecordMetadata` in
  src/aiperf/common/metric_records_wire.py; metric tags from src/aiperf/metrics/types/, e.g.
  time_to_first_output_token_metric.py, and docs/metrics_reference.md): one JSON object per request
  with `metadata` (`x_request_id`, `x_correlation_id`, `request_start_ns`, `request_end_ns`,
  `was_cancelled`; defaults may be omitted), `metrics` ({tag: {value, unit}} in display units:
  `time_to_first_token`, `time_to_first_output_token` (first non-reasoning token), `request_latency`,
  `inter_chunk_latency` (list), `input_sequence_length`, `output_sequence_length` (AIPerf's own
  re-tokenization: `output_token_count` + `reasoning_token_count`), `usage_prompt_tokens`,
  `usage_completion_tokens`, `usage_reasoning_tokens` (the server's usage), ...) and `error`
  ({code, type, message} or null/absent). The server's usage counts win over AIPerf's token counts.
  Beside it, `profile_export_aiperf.json` holds `input_config`: the model is
  `input_config.models.items[].name` (src/aiperf/config/models.py `ModelsAdvanced`; written by
  src/aiperf/exporters/metrics_json_exporter.py), in older versions `input_config.endpoint.model_names`.

Fields the source does not have stay null and are listed in run.json under `missing`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from .errors import ReportError
from .schema import RECORD_SCHEMA

UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}
VLLM_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "errors", "generated_texts", "start_times")
# Never listed as missing: our own fields, and ones null by nature (no sessions, no failures).
OURS = ("worker", "target_model", "target", "session_id", "http_status", "error")


def _status_from_text(text: str, code: int | None = None) -> str:
    low = text.lower()
    if "timeout" in low or "timed out" in low:
        return "timeout"
    if "cancel" in low:
        return "cancelled"
    if "connect" in low or "reset" in low:
        return "connection_error"
    return "http_error" if code is None or 400 <= code < 600 else "protocol_error"


def _chunk_fields(ok: bool, sent: float, ttft_s: float | None, gaps_s: list[float] | None):
    """first/last token times and token_times (relative to sent) from TTFT + chunk gaps."""
    if not ok or ttft_s is None:
        return None, None, None
    rel = np.cumsum([ttft_s, *(gaps_s or [])]).tolist()
    return sent + rel[0], sent + rel[-1], rel


def read_vllm(src: Path, model: str | None = None) -> tuple[list[dict], dict, list[str]]:
    """(per-request records as dicts, the run's config, notes) of a vLLM result."""
    try:
        data = json.loads(src.read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot read vLLM result JSON: {e}", file=src) from None
    if not isinstance(data, dict) or "ttfts" not in data:
        raise ReportError("no per-request 'ttfts': use `vllm bench serve --save-detailed`", file=src, field="ttfts")
    n = len(data["ttfts"])
    for key in VLLM_LISTS:
        if key in data and len(data[key]) != n:
            raise ReportError(f"has {len(data[key])} entries, 'ttfts' has {n}", file=src, field=key)
    notes = []
    starts = data.get("start_times")
    if starts is None:
        starts = [0.0] * n
        notes.append("no start_times in this vLLM result (older vLLM): every request is placed at t=0, so latencies "
                     f"are right but throughput and time series are not (vLLM's duration was {data.get('duration')} s)")
    t0 = min(starts) if n else 0.0
    errors, itls = data.get("errors") or [""] * n, data.get("itls", [[]] * n)
    inputs, outputs = data.get("input_lens") or [None] * n, data.get("output_lens") or [None] * n
    label = model or data.get("model_id") or None
    rows = []
    for i in range(n):   # parsing JSON lists is per request by nature
        ok, sent = not errors[i], float(starts[i]) - t0
        first, last, rel = _chunk_fields(ok, sent, data["ttfts"][i], itls[i])
        rows.append({"request_id": str(i), "sent_s": sent, "first_token_s": first, "last_token_s": last,
                     "token_times": rel, "status": "ok" if ok else _status_from_text(errors[i]),
                     "error": None if ok else str(errors[i])[:500], "input_tokens": inputs[i],
                     "completion_tokens": outputs[i] if ok else None, "model": label})
    return rows, {k: v for k, v in data.items() if k not in VLLM_LISTS and not isinstance(v, (list, dict))}, notes


def _metric(metrics: dict, *names: str, seconds: bool = False):
    """The first of `names` with a value; with `seconds`, converted from its display unit."""
    for name in names:
        m = metrics.get(name)
        if isinstance(m, dict) and m.get("value") is not None:
            if not seconds:
                return m["value"]
            scale, v = UNIT_S.get(str(m.get("unit", "ms")).lower(), 1e-3), m["value"]
            return [x * scale for x in v] if isinstance(v, list) else v * scale
    return None


def read_aiperf(src: Path, model: str | None = None) -> tuple[list[dict], dict | None, list[str]]:
    """(per-request records as dicts, AIPerf's input_config, notes) of an AIPerf export."""
    try:
        lines = [ln for ln in src.read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise ReportError(f"cannot read AIPerf export: {e}", file=src) from None
    recs = []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise ReportError(f"line {i + 1} is not JSON: {e}", file=src) from None
        if not isinstance(rec, dict) or "metadata" not in rec:
            raise ReportError(f"line {i + 1}: no 'metadata' (not profile_export.jsonl?)", file=src, field="metadata")
        if rec["metadata"].get("request_start_ns") is None:
            raise ReportError(f"line {i + 1} has no request_start_ns", file=src, field="metadata.request_start_ns")
        recs.append(rec)
    config, notes = None, []
    sibling = src.with_name("profile_export_aiperf.json")
    if sibling.exists():
        try:
            config = json.loads(sibling.read_text()).get("input_config") or {}
            names = ([m.get("name") for m in (config.get("models") or {}).get("items", [])]
                     or (config.get("endpoint") or {}).get("model_names") or [])
            if len(names) > 1 and not model:
                notes.append(f"AIPerf ran {len(names)} models ({', '.join(names)}) and its records do not "
                             "say which served each request: labelled with the first (--model to override)")
            model = model or (names[0] if names else None)
        except (OSError, ValueError, AttributeError, TypeError):
            notes.append(f"could not read {sibling.name}; no run config imported")
    t0 = min(r["metadata"]["request_start_ns"] for r in recs) if recs else 0
    rows = []
    for i, r in enumerate(recs):
        md, mt, err = r["metadata"], r.get("metrics") or {}, r.get("error") or {}
        sent = (md["request_start_ns"] - t0) * 1e-9
        status = ("cancelled" if md.get("was_cancelled") else "ok" if not err else
                  _status_from_text(f"{err.get('type', '')} {err.get('message', '')}", err.get("code")))
        ok = status == "ok"
        first, last, rel = _chunk_fields(ok, sent, _metric(mt, "time_to_first_token", seconds=True),
                                         _metric(mt, "inter_chunk_latency", seconds=True))
        lat = _metric(mt, "request_latency", seconds=True)
        if ok and lat is not None:
            last = sent + lat
        elif ok and md.get("request_end_ns") and rel is None:
            last = (md["request_end_ns"] - t0) * 1e-9
        # server usage first; AIPerf's re-tokenized counts (output_sequence_length ~10 % high) as fallback
        reasoning = _metric(mt, "usage_reasoning_tokens", "reasoning_token_count") if ok else None
        ttfa = _metric(mt, "time_to_first_output_token", seconds=True) if ok else None
        if rel is None:
            rc = None
        elif ttfa is not None:     # chunks before the first answer chunk (TTFA is one of the chunk times)
            rc = sum(t < ttfa - 1e-6 for t in rel)
        else:                      # no answer: all chunks were reasoning, if there was any
            rc = len(rel) if reasoning else None
        rows.append({"request_id": md.get("x_request_id") or str(i), "session_id": md.get("x_correlation_id"),
                     "sent_s": sent, "first_token_s": first, "last_token_s": last,
                     "first_answer_s": None if ttfa is None else sent + ttfa, "token_times": rel,
                     "input_tokens": _metric(mt, "input_sequence_length", "error_isl"),
                     "prompt_tokens": _metric(mt, "usage_prompt_tokens") if ok else None,
                     "completion_tokens": _metric(mt, "usage_completion_tokens", "output_sequence_length",
                                                  "output_token_count") if ok else None,
                     "reasoning_tokens": reasoning, "reasoning_chunks": rc, "status": status,
                     "http_status": err.get("code") if status == "http_error" else None,
                     "error": None if ok else f"{err.get('type', 'cancelled')}: {err.get('message', '')}"[:500],
                     "model": model or None})
    return rows, config, notes


READERS = {"vllm": read_vllm, "aiperf": read_aiperf}


def import_results(fmt: str, src: str | Path, out_dir: str | Path, *, model: str | None = None) -> dict:
    """Convert `src` (format 'vllm' or 'aiperf') into a run directory; returns rows/missing/notes."""
    import pyarrow.parquet as pq
    if fmt not in READERS:
        raise ReportError(f"unknown result format {fmt!r} (known: {', '.join(READERS)})")
    src, out = Path(src), Path(out_dir)
    rows, config, notes = READERS[fmt](src, model)
    missing = [f.name for f in RECORD_SCHEMA if f.name not in OURS and all(r.get(f.name) is None for r in rows)]
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=RECORD_SCHEMA), out / "records.parquet")
    run = {"imported_from": {"tool": fmt, "file": str(src)}, "missing": missing, "notes": notes, "source_config": config}
    (out / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
    return {"rows": len(rows), "missing": missing, "notes": notes, "dir": str(out)}
