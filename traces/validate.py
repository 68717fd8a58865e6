"""`validate_file`, the whole check of a trace file in bounded memory (`replay trace validate`,
`replay run`); `timing_warnings`, a gap or a delay that would keep a replay waiting for ever."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import TraceError
from .schema import check_blocks, schema_for


def validate_file(path: str | Path, *, sort: bool = False, batch_size: int = 1 << 16) -> dict[str, Any]:
    """Check a trace file against every rule `Trace.read` applies (the schema's columns and
    types, the row rules of `trace.conform`, order across the file, unique request ids, prefix
    blocks against the metadata's block_size), Parquet batch by batch: memory is one batch
    plus the request ids, never the whole table. Returns {"rows", "duration_s", "columns" (as
    read, request_id included)}; raises TraceError (a ValueError whose str is the one-line
    message `replay trace validate` prints). Canonical CSV/JSONL are read whole (`Trace.read`)."""
    from .trace import Trace, conform
    path = Path(path)
    if path.suffix.lower() in (".csv", ".jsonl", ".json", ".ndjson"):
        t = Trace.read(path, sort=sort)
        return {"rows": t.num_rows, "duration_s": t.duration_s, "columns": t.table.column_names}
    file = str(path)
    if not path.exists():
        raise TraceError("file not found", file=file)
    bs = Trace.read_metadata(path).get("block_size")
    rows, lo, hi, names, kept = 0, math.inf, -math.inf, [], {}  # kept: the id and graph columns' chunks
    try:
        total = pq.ParquetFile(path).metadata.num_rows
        for b in Trace.iter_batches(path, batch_size=batch_size):
            if not b.num_rows:
                continue
            try:
                t = conform(pa.Table.from_batches([b]), file=file, sort=sort, fill_request_id=False)
                if bs and "hash_ids" in t.column_names:
                    if not isinstance(bs, int) or bs < 1:
                        raise TraceError(f"metadata block_size must be a positive integer, got {bs!r}", file=file)
                    check_blocks(t.column("hash_ids"), t.column("input_tokens"), bs, file=file)
            except TraceError as e:  # rows are batch-relative: report them as file rows
                raise TraceError(e.rule, file=file, column=e.column, total_rows=None if e.rows is None else total,
                                 rows=None if e.rows is None else [r + rows for r in e.rows]) from None
            mm = pc.min_max(t.column("arrival_ns"))
            if t.column("arrival_ns")[0].as_py() < hi and not sort:
                raise TraceError("arrival_ns must be non-decreasing (use --sort to sort the trace)", file=file,
                                 column="arrival_ns", rows=[rows], total_rows=total)
            lo, hi = min(lo, mm["min"].as_py()), max(hi, mm["max"].as_py())
            names = t.column_names
            for c in {"request_id", "task_id", "depends_on"} & set(names):
                kept.setdefault(c, []).extend(t.column(c).chunks)
            rows += t.num_rows
    except (OSError, pa.ArrowException) as e:
        from .trace import not_parquet
        raise not_parquet(file, e) from None
    if not rows:
        raise TraceError("the trace is empty (0 rows)", file=file)
    if ids := kept.get("request_id"):
        unique_ids(ids, file, total_rows=rows)
    if "depends_on" in kept:
        from .graph import check_graph
        rid = pa.chunked_array(ids, pa.string()) if ids else pa.array(np.arange(rows)).cast(pa.string())
        check_graph(rid, pa.chunked_array(kept["task_id"], pa.string()) if "task_id" in kept else None,
                    pa.chunked_array(kept["depends_on"], pa.list_(pa.string())), file=file)
    return {"rows": rows, "duration_s": (hi - lo) / 1e9,
            "columns": schema_for(sorted({*names, "request_id"})).names}


def unique_ids(chunks: list[pa.Array], file: str, total_rows: int | None = None) -> None:
    """Raise naming the rows of the first duplicated request_id among `chunks` (a file's ids)."""
    col = pa.chunked_array(chunks, pa.string())
    dup = pc.filter(vc := pc.value_counts(col), pc.greater(vc.field("counts"), 1))
    if len(dup):
        first = dup.field("values")[0].as_py()
        raise TraceError(f"request_id must be unique ({len(dup)} duplicated ids, e.g. {first!r})", file=file,
                         column="request_id", total_rows=total_rows,
                         rows=np.flatnonzero(pc.equal(col, first).to_numpy(zero_copy_only=False)).tolist())


WAIT_WARN_S = 3600.0   # a gap between arrivals or a delay_s at least this long, that dwarfs the rest


def _long(s: float) -> str:
    for unit, size in (("years", 31_557_600), ("days", 86_400), ("hours", 3_600)):
        if s >= size:
            return f"{s:.4g} s ({s / size:.3g} {unit})"
    return f"{s:.4g} s"


def timing_warnings(path: str | Path, max_delay_s: float | None = None) -> list[str]:
    """One line each, naming the row (0-based, as errors do), when a replay of the (valid) trace
    would wait absurdly long: the longest gap between consecutive arrivals when it is at least
    WAIT_WARN_S and ten times the rest of the span (a last arrival at int64 max); the longest
    delay_s when it is at least WAIT_WARN_S and longer than the whole span (saying whether
    `max_delay_s`, a run's --max-delay, caps it). Reads arrival_ns and delay_s only."""
    from .trace import Trace
    path = Path(path)
    if path.suffix.lower() in (".csv", ".jsonl", ".json", ".ndjson"):
        batches = Trace.read(path, sort=True).table.to_batches()   # valid once sorted (--sort): as replayed
    else:
        cols = [c for c in ("arrival_ns", "delay_s") if c in pq.read_schema(path).names]
        batches = pq.ParquetFile(path).iter_batches(batch_size=1 << 16, columns=cols)
    row, prev, lo, hi = 0, None, None, None
    gap, gap_row, delay, delay_row, capped, ordered = 0, None, -1.0, None, 0, True
    for b in batches:
        a = b.column("arrival_ns").cast(pa.int64()).to_numpy()
        if not len(a):
            continue
        d = np.diff(a, prepend=a[0] if prev is None else prev)   # int64: exact at int64 max
        k = int(np.argmax(d))
        ordered = ordered and bool((d >= 0).all())   # gaps of an unsorted file (--sort) mean nothing
        if d[k] > gap:
            gap, gap_row = int(d[k]), row + k
        lo, hi = min(lo, int(a.min())) if lo is not None else int(a.min()), max(hi or 0, int(a.max()))
        prev = a[-1]
        if "delay_s" in b.schema.names:
            x = b.column("delay_s").cast(pa.float64()).fill_null(-1.0).to_numpy()
            k = int(np.argmax(x))
            if x[k] > delay:
                delay, delay_row = float(x[k]), row + k
            if max_delay_s is not None:
                capped += int((x > max_delay_s).sum())
        row += len(a)
    out = []
    span, gap_s = ((hi - lo) / 1e9, gap / 1e9) if lo is not None else (0.0, 0.0)
    rest = span - gap_s
    if ordered and gap_s >= WAIT_WARN_S and gap_s > 10 * rest:
        out.append(f"{path}: row {gap_row} arrives {_long(gap_s)} after the row before it, against "
                   f"{_long(rest)} for the rest of the trace: a replay waits that long (--duration ends it sooner)")
    if delay >= WAIT_WARN_S and delay > span:
        cap = (f"--max-delay {max_delay_s:g} s caps it ({capped} row{'s' if capped > 1 else ''} over that)"
               if max_delay_s is not None and delay > max_delay_s else
               "it is sent that long after its dependencies end (replay run --max-delay S caps delays)")
        out.append(f"{path}: row {delay_row} has delay_s {_long(delay)}, longer than the whole trace "
                   f"({_long(span)}): {cap}")
    return out
