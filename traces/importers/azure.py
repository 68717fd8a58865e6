"""Azure LLM inference traces (2023 code/conversation, 2024 week-long, 2025 multimodal).

Source columns: `TIMESTAMP` (ISO-8601 wall clock, UTC: 2023 naive with 7 fractional digits;
2024 `+00:00` with the fraction omitted when zero; 2025 `...Z`), `ContextTokens` (prompt
tokens), `GeneratedTokens` (output tokens); 2025's `NumImages` (images per request) is
`num_images`; any other column goes to `extra` verbatim. CRLF line ends and a missing final
newline are handled and remembered.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..trace import Trace
from .common import csv_tables, export_source, extra_columns, write_csv
from .timeparse import format_iso, iso_ns, merge_time_format
DOC = "Azure LLM inference trace CSV: TIMESTAMP (ISO-8601 UTC), ContextTokens, GeneratedTokens"
TIME, INPUT, OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"
IMAGES = "NumImages"
KNOWN = (TIME, INPUT, OUTPUT, IMAGES)
LICENSE = "CC-BY-4.0 (Azure Public Dataset)"


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    meta["time_origin_kind"] = "unix_epoch_utc"
    fmt = None
    for row0, t, extra in csv_tables(src, meta, {INPUT: pa.int64(), OUTPUT: pa.int64(), IMAGES: pa.int64()},
                                     [TIME, INPUT, OUTPUT], KNOWN, license=LICENSE):
        ns, f = iso_ns(t.column(TIME), file=str(src), column=TIME, row0=row0)
        meta["original_time_format"] = fmt = merge_time_format(fmt, f)
        cols = {"arrival_ns": pa.array(ns, pa.int64()), "input_tokens": t.column(INPUT),
                "output_tokens": t.column(OUTPUT), "num_images": t.column(IMAGES) if IMAGES in t.column_names else None,
                "extra": extra}
        yield pa.table({k: v for k, v in cols.items() if v is not None})
    if fmt is not None:
        meta["timestamp_quantum_ns"] = 10 ** (9 - max(fmt["fraction_digits"]))


def export(trace: Trace, out: Path) -> None:
    """Write the trace back as an Azure CSV in the source's time format and line ends."""
    t, (src, ns) = trace.table, export_source(trace, "azure")
    ts = format_iso(ns, trace.metadata.get("original_time_format"))
    has_images = "num_images" in t.column_names
    names = src.get("columns") or [TIME, INPUT, OUTPUT, *([IMAGES] if has_images else [])]
    # a trace imported before num_images existed still has NumImages in `extra`
    others = [n for n in names if n not in (TIME, INPUT, OUTPUT) and not (n == IMAGES and has_images)]
    cols = {TIME: ts, INPUT: t.column("input_tokens"), OUTPUT: t.column("output_tokens"),
            **{k: pa.array(v, pa.string()) for k, v in extra_columns(t, others).items()}}
    if has_images:
        cols[IMAGES] = t.column("num_images")
    write_csv(pa.table({n: cols[n] for n in names}), out, src or {"line_terminator": "\r\n"})
