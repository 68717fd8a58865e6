"""Vidur request traces (the simulator's trace-replay CSV).

Source columns: `arrived_at` (seconds from the trace start), `num_prefill_tokens` (input),
`num_decode_tokens` (output); any other column is kept in `extra` verbatim. Vidur's length
files (e.g. arxiv_summarization / sharegpt `*_stats_*.csv`) have no `arrived_at`: import them
with `--rate R [--arrivals poisson|gamma:CV|weibull:CV] [--seed S]` for seeded arrivals.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..trace import Trace
from ..errors import TraceError
from .common import (SynthArrivals, arrival_process, csv_header, csv_tables, export_source, extra_columns,
                     reject_arrival_options, write_csv)
from .timeparse import decimal_ns, decimal_text
DOC = "Vidur CSV: arrived_at (s), num_prefill_tokens, num_decode_tokens (lengths-only files: --rate)"
SYNTH_ARRIVALS = True  # accepts --rate/--arrivals (for files without arrived_at)
TIME, INPUT, OUTPUT = "arrived_at", "num_prefill_tokens", "num_decode_tokens"


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    proc = arrival_process(opts)
    if TIME in csv_header(src):
        reject_arrival_options(opts, "this file has arrival times", file=str(src), column=TIME)
    elif proc is None:
        raise TraceError(f"no {TIME} column: a lengths-only file needs --rate R (req/s) [--arrivals "
                         "poisson|gamma:CV|weibull:CV] [--seed S] for synthesized arrivals", file=str(src))
    arrivals = SynthArrivals(proc, meta) if proc else None
    if not proc:
        meta.update(time_origin_kind="trace_start", original_time_format={"kind": "decimal", "unit": "s"})
    for row0, t, extra in csv_tables(src, meta, {INPUT: pa.int64(), OUTPUT: pa.int64()},
                                     [INPUT, OUTPUT, *[TIME] * (not proc)], (TIME, INPUT, OUTPUT)):
        ns = arrivals(t.num_rows) if proc else decimal_ns(t.column(TIME), 10**9, file=str(src), column=TIME, row0=row0)
        cols = {"arrival_ns": pa.array(ns, pa.int64()), "input_tokens": t.column(INPUT), "output_tokens": t.column(OUTPUT)}
        yield pa.table({**cols, "extra": extra} if extra is not None else cols)


def export(trace: Trace, out: Path) -> None:
    """Vidur CSV with exact decimal seconds."""
    t, (src, ns) = trace.table, export_source(trace, "vidur")
    names = src.get("columns") or [TIME, INPUT, OUTPUT]
    if TIME not in names:  # imported from a lengths-only file: write the synthesized arrivals
        i = int(names[0] == "")  # after Vidur's unnamed index column
        names = [*names[:i], TIME, *names[i:]]
    others = [n for n in names if n not in (TIME, INPUT, OUTPUT)]
    cols = {TIME: decimal_text(ns, 10**9), INPUT: t.column("input_tokens"), OUTPUT: t.column("output_tokens"),
            **{k: pa.array(v, pa.string()) for k, v in extra_columns(t, others).items()}}
    write_csv(pa.table({n: cols[n] for n in names}), out, src or None)
