"""Mooncake (Kimi) traces: JSON lines `{"timestamp", "input_length", "output_length", "hash_ids"}`.

`timestamp` is milliseconds from the trace start; `hash_ids` are prefix blocks of 512 tokens
(equal id = identical block, chain-hashed so equal ids imply equal prefixes). Other keys are
kept in `extra`. `--dequantize uniform` spreads requests that share a bucketed timestamp evenly
over the bucket (`--quantum-ms`, default: the detected bucket width, e.g. ~3 s buckets whose
timestamps jitter by a few ms; else the GCD of the timestamps).
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..trace import Trace
from .common import check_blocks, export_source, json_columns, jsonl_batches

DOC = "Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)"
BLOCK_SIZE = 512
LICENSE = "Apache-2.0 (kvcache-ai/Mooncake)"
FIELDS = {"input_length": ("input_tokens", pa.int64()), "output_length": ("output_tokens", pa.int64()),
          "hash_ids": ("hash_ids", pa.list_(pa.int64()))}


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    meta["source"].update(license=LICENSE)
    meta.update(block_size=BLOCK_SIZE, time_origin_kind="trace_start",
                original_time_format={"kind": "decimal", "unit": "ms"}, timestamp_quantum_ns=10**6)
    for row0, objs in jsonl_batches(src):
        cols = json_columns(objs, FIELDS, "timestamp", 10**6, file=str(src), row0=row0,
                            required=("input_length",))
        check_blocks(cols["hash_ids"], cols["input_tokens"], BLOCK_SIZE, file=str(src), row0=row0)
        yield pa.table(cols)


def postprocess(out: Path, opts: argparse.Namespace) -> bool:
    """`--dequantize uniform` needs the whole trace (buckets may straddle batches)."""
    if opts.dequantize != "uniform":
        return False
    from ..transform import dequantize
    q = int(opts.quantum_ms * 1e6) if opts.quantum_ms else None
    dequantize(Trace.read(out), q).write(out)
    return True


def export(trace: Trace, out: Path) -> None:
    """Mooncake JSONL: integer ms timestamps (sub-ms arrivals are rounded down)."""
    write_jsonl(trace, out, lambda ns: (ns // 10**6).tolist(),
                {"input_tokens": "input_length", "output_tokens": "output_length", "hash_ids": "hash_ids"})


def write_jsonl(trace: Trace, out: Path, to_time, names: dict[str, str]) -> None:
    """One JSON object per row: `timestamp` from `to_time(absolute ns) -> list`, renamed columns
    (digit-only string ids written back as integers), and the row's `extra` keys merged in."""
    t, times = trace.table, to_time(export_source(trace)[1])
    cols = {v: t.column(k).to_pylist() for k, v in names.items() if k in t.column_names}
    for k in ("request_id", "parent_id"):
        if names.get(k) in cols:
            cols[names[k]] = [int(x) if isinstance(x, str) and x.lstrip("-").isdigit() else x for x in cols[names[k]]]
    extras = t.column("extra").to_pylist() if "extra" in t.column_names else [None] * t.num_rows
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for i, ts in enumerate(times):
            row = {"timestamp": ts, **{k: v[i] for k, v in cols.items()}}
            if extras[i]:
                row.update(json.loads(extras[i]))
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
