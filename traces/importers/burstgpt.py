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
from .common import csv_batches, extra_columns, extra_json, file_layout, write_csv
from .timeparse import decimal_ns
DOC = "BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type"
TIME, MODEL, REQ, RESP, TOTAL, LOG = "Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"
SESSION, ELAPSED = "Session ID", "Elapsed time"
LICENSE = "CC-BY-4.0 (BurstGPT, HPMLL)"
MAPPED = {MODEL: "model", REQ: "input_tokens", RESP: "output_tokens", LOG: "client_id", SESSION: "session_id"}


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    names, batches = csv_batches(src, {REQ: pa.int64(), RESP: pa.int64(), TOTAL: pa.int64(),
                                       ELAPSED: pa.float64()}, [TIME, REQ, RESP])
    others = [n for n in names if n not in (TIME, TOTAL, ELAPSED, *MAPPED)]
    meta["source"].update(license=LICENSE, columns=names, **file_layout(src))
    meta["time_origin_kind"] = "seconds_since_first_midnight"
    meta["original_time_format"] = {"kind": "decimal", "unit": "s"}
    row0 = 0
    for t in batches:
        cols = {"arrival_ns": pa.array(decimal_ns(t.column(TIME), 10**9, file=str(src), column=TIME, row0=row0))}
        for src_name, name in MAPPED.items():
            if src_name in names:
                cols[name] = t.column(src_name)
        cols["failed_in_source"] = pc.equal(t.column(RESP), 0)
        if ELAPSED in names:
            cols["observed_latency_s"] = t.column(ELAPSED)
        extra = extra_json(t, others) if others else None
        if TOTAL in names:
            extra = _total_mismatch(t, extra)
        if others or TOTAL in names:  # the same columns in every batch, even where all null
            cols["extra"] = extra if extra is not None else pa.nulls(t.num_rows, pa.string())
        row0 += t.num_rows
        yield pa.table(cols)


def _total_mismatch(t: pa.Table, extra: pa.Array | None) -> pa.Array | None:
    """Keep `Total tokens` (in `extra`) only on rows where it is not input + output."""
    total = t.column(TOTAL).to_numpy(zero_copy_only=False).astype(np.float64)
    s = (t.column(REQ).to_numpy(zero_copy_only=False).astype(np.float64)
         + t.column(RESP).to_numpy(zero_copy_only=False).astype(np.float64))
    bad = np.flatnonzero(~((total == s) | (np.isnan(total) & np.isnan(s))))
    if len(bad) == 0:
        return extra
    rows = [json.loads(e) if e else {} for e in extra.to_pylist()] if extra is not None else [{} for _ in range(t.num_rows)]
    for i in bad:
        v = t.column(TOTAL)[int(i)].as_py()
        rows[i][TOTAL] = v
    return pa.array([json.dumps(r) if r else None for r in rows], pa.string())


def export(trace: Trace, out: Path) -> None:
    """Write a BurstGPT CSV (Timestamp in seconds since the source origin, shortest exact decimal)."""
    t, meta = trace.table, trace.metadata
    src = meta.get("source", {}) if meta.get("source", {}).get("format") == "burstgpt" else {}
    names = src.get("columns") or [TIME, MODEL, REQ, RESP, TOTAL, LOG]
    ns = t.column("arrival_ns").to_numpy() + int(meta.get("time_origin_ns") or 0)
    secs, frac = np.divmod(ns, 10**9)
    frac_s = pc.utf8_rtrim(pc.utf8_lpad(pa.array(frac).cast(pa.string()), 9, "0"), characters="0")
    ts = pc.if_else(pa.array(frac == 0), pa.array(secs).cast(pa.string()),
                    pc.binary_join_element_wise(pa.array(secs).cast(pa.string()), frac_s, "."))
    others = [n for n in names if n not in (TIME, TOTAL, ELAPSED, REQ, RESP, *MAPPED)]
    ex = extra_columns(t, [*others, TOTAL])
    inp, out_tok = t.column("input_tokens"), t.column("output_tokens")
    total = pc.add(inp.cast(pa.int64()), out_tok.cast(pa.int64()))
    total = pa.array([e if e is not None else s for e, s in zip(ex[TOTAL], total.to_pylist())], pa.int64())
    cols = {TIME: ts, REQ: inp, RESP: out_tok, TOTAL: total,
            **{k: pa.array(v, pa.string()) for k, v in ex.items() if k != TOTAL}}
    for src_name, name in MAPPED.items():
        if name in t.column_names and src_name not in (REQ, RESP):
            cols[src_name] = t.column(name).cast(pa.string())
    if "observed_latency_s" in t.column_names:
        cols[ELAPSED] = t.column("observed_latency_s")
    names = [n for n in names if n in cols] or list(cols)
    write_csv(pa.table({n: cols[n] for n in names}), out, src or None)
