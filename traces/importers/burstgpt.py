"""BurstGPT (Azure OpenAI GPT usage at a campus; BurstGPT_1/2 and BurstGPT_3 with sessions).

Source columns: `Timestamp` (seconds since midnight of the first day), `Model` (ChatGPT /
GPT-4), `Request tokens`, `Response tokens`, `Total tokens`, `Log Type` (Conversation log /
API log -> `client_id`); BurstGPT_3 adds `Session ID` and `Elapsed time` (s ->
`observed_latency_s`). `Response tokens == 0` marks a request that failed in the source:
it is kept and flagged `failed_in_source` (or dropped with `--drop-failed`, counted in the
metadata). `Total tokens` is checked against input + output; rows where it differs keep it
in `extra`, like every unknown column.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..trace import Trace
from .common import csv_tables, export_source, extra_columns, write_csv
from .timeparse import decimal_ns, decimal_text
DOC = "BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type"
TIME, MODEL, REQ, RESP, TOTAL, LOG = "Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"
SESSION, ELAPSED = "Session ID", "Elapsed time"
LICENSE = "CC-BY-4.0 (BurstGPT, HPMLL)"
MAPPED = {MODEL: "model", REQ: "input_tokens", RESP: "output_tokens", LOG: "client_id", SESSION: "session_id"}
KNOWN, TYPES = (TIME, TOTAL, ELAPSED, *MAPPED), {REQ: pa.int64(), RESP: pa.int64(), TOTAL: pa.int64(), ELAPSED: pa.float64()}


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    meta.update(time_origin_kind="seconds_since_first_midnight", original_time_format={"kind": "decimal", "unit": "s"})
    for row0, t, extra in csv_tables(src, meta, TYPES, [TIME, REQ, RESP], KNOWN, license=LICENSE):
        cols = {"arrival_ns": pa.array(decimal_ns(t.column(TIME), 10**9, file=str(src), column=TIME, row0=row0))}
        cols.update({name: t.column(s) for s, name in MAPPED.items() if s in t.column_names})
        cols["failed_in_source"] = pc.equal(t.column(RESP), 0)
        if ELAPSED in t.column_names:
            cols["observed_latency_s"] = t.column(ELAPSED)
        if TOTAL in t.column_names:
            extra = _total_mismatch(t, extra)
        if TOTAL in t.column_names or set(t.column_names) - set(KNOWN):  # the same columns in every batch
            cols["extra"] = extra if extra is not None else pa.nulls(t.num_rows, pa.string())
        yield pa.table(cols)


def _total_mismatch(t: pa.Table, extra: pa.Array | None) -> pa.Array | None:
    """Keep `Total tokens` (in `extra`) only on rows where it is not input + output."""
    total, req, resp = (t.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in (TOTAL, REQ, RESP))
    bad = np.flatnonzero(~((total == req + resp) | (np.isnan(total) & np.isnan(req + resp))))
    if len(bad) == 0:
        return extra
    rows = [json.loads(e) if e else {} for e in extra.to_pylist()] if extra is not None else [{} for _ in range(t.num_rows)]
    for i in bad:
        rows[i][TOTAL] = t.column(TOTAL)[int(i)].as_py()
    return pa.array([json.dumps(r) if r else None for r in rows], pa.string())


def export(trace: Trace, out: Path) -> None:
    """Write a BurstGPT CSV (Timestamp in seconds since the source origin, shortest exact decimal)."""
    t, (src, ns) = trace.table, export_source(trace, "burstgpt")
    names = src.get("columns") or [TIME, MODEL, REQ, RESP, TOTAL, LOG]
    others = [n for n in names if n not in KNOWN]
    ex = extra_columns(t, [*others, TOTAL])
    inp, out_tok = t.column("input_tokens"), t.column("output_tokens")
    total = pc.add(inp.cast(pa.int64()), out_tok.cast(pa.int64()))
    total = pa.array([e if e is not None else s for e, s in zip(ex[TOTAL], total.to_pylist())], pa.int64())
    cols = {TIME: decimal_text(ns, 10**9), REQ: inp, RESP: out_tok, TOTAL: total,
            **{k: pa.array(v, pa.string()) for k, v in ex.items() if k != TOTAL}}
    for src_name, name in MAPPED.items():
        if name in t.column_names and src_name not in (REQ, RESP):
            cols[src_name] = t.column(name).cast(pa.string())
    if "observed_latency_s" in t.column_names:
        cols[ELAPSED] = t.column("observed_latency_s")
    names = [n for n in names if n in cols] or list(cols)
    write_csv(pa.table({n: cols[n] for n in names}), out, src or None)
