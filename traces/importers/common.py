"""Reading helpers shared by the importers: streamed CSV and JSON lines, `extra`, CSV writing."""
from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ..errors import TraceError
from ..schema import check_blocks  # noqa: F401 - importers use it from here
from .timeparse import Num, decimal_ns, first_rows, num_text

CSV_BLOCK = 16 << 20


def check_file(path: Path) -> None:
    if not path.exists():
        raise TraceError("file not found", file=str(path))
    if path.is_dir():
        raise TraceError("is a directory, expected a file", file=str(path))
    if path.stat().st_size == 0:
        raise TraceError("the file is empty", file=str(path))


def file_layout(path: Path) -> dict[str, Any]:
    """Line terminator and final newline of a text file, so export can reproduce them."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
        f.seek(-1, 2)
        last = f.read(1)
    return {"line_terminator": "\r\n" if b"\r\n" in head else "\n", "final_newline": last == b"\n"}


def csv_header(path: Path) -> list[str]:
    check_file(path)
    with open(path, "rb") as f:
        line = f.readline(1 << 20)
    try:
        names = next(csv.reader([line.decode("utf-8-sig").rstrip("\r\n")]))
    except (UnicodeDecodeError, StopIteration, csv.Error) as e:
        raise TraceError(f"cannot read the CSV header: {e}", file=str(path)) from None
    if not names or not any(n.strip() for n in names):
        raise TraceError("the CSV header is empty", file=str(path))
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise TraceError(f"duplicate CSV column name(s) {dup}", file=str(path))
    return names


def csv_tables(path: Path, meta: dict[str, Any], types: dict[str, pa.DataType], required: list[str],
               known: Any = (), **source: Any) -> Iterator[tuple[int, pa.Table, pa.Array | None]]:
    """Stream a CSV in ~16 MB blocks as (first data row, table, `extra_json` of the columns not in
    `known`). Columns in `types` are parsed by Arrow with that type, every other column is kept
    as its verbatim string; CRLF and a missing final newline are fine. Records `source`, the
    columns and the line ends in meta["source"] (for export)."""
    names = csv_header(path)
    if missing := [c for c in required if c not in names]:
        raise TraceError(f"missing column(s) {', '.join(missing)}; the header has: {', '.join(names)}", file=str(path))
    meta["source"].update({**source, "columns": names, **file_layout(path)})
    others, row0 = [n for n in names if n not in known], 0
    convert = pcsv.ConvertOptions(column_types={n: types.get(n, pa.string()) for n in names}, strings_can_be_null=False)
    try:  # parsing runs in a thread (Arrow releases the GIL) while the caller converts and writes
        for batch in prefetch(pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=CSV_BLOCK),
                                            convert_options=convert)):
            t = pa.Table.from_batches([batch])
            yield row0, t, extra_json(t, others)
            row0 += t.num_rows
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError) as e:
        raise _csv_error(path, e, types) from None


def export_source(trace: Any, fmt: str | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """For export: the trace's metadata `source` if it was imported from `fmt` (else {}), and
    its arrivals as absolute ns in the source's clock."""
    src, meta = trace.metadata.get("source", {}), trace.metadata
    ns = trace.table.column("arrival_ns").to_numpy() + int(meta.get("time_origin_ns") or 0)
    return (src if fmt and src.get("format") == fmt else {}), ns


def prefetch(it, depth: int = 2) -> Iterator:
    """Iterate `it` in a background thread, at most `depth` items ahead (bounded memory);
    its exceptions are re-raised here."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    it, done = iter(it), object()
    with ThreadPoolExecutor(1) as pool:  # one worker: the items come in order
        ahead = deque(pool.submit(next, it, done) for _ in range(depth))
        while (x := ahead.popleft().result()) is not done:
            ahead.append(pool.submit(next, it, done))
            yield x


def _csv_error(path: Path, e: Exception, types: dict[str, pa.DataType]) -> TraceError:
    """Turn an Arrow CSV error into one naming the column and data rows (cold path: rescans
    each typed column as text for the first values its type cannot parse)."""
    msg = str(e).split("\n")[0][:300]
    for name, typ in types.items() if "conversion error" in msg else ():
        try:
            t = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
                column_types={name: pa.string()}, include_columns=[name], strings_can_be_null=True))
        except (pa.ArrowInvalid, KeyError):
            continue
        pattern = r"^\s*[-+]?\d+\s*$" if pa.types.is_integer(typ) else r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
        ok = pc.match_substring_regex(t.column(name), pattern).fill_null(True).to_numpy(zero_copy_only=False)
        if bad := first_rows(~ok, 0):
            return TraceError(f"expected {typ} values: {msg}", file=str(path), column=name, rows=bad)
    return TraceError(f"not a valid CSV file: {msg}", file=str(path))


def extra_json(table: pa.Table, columns: list[str]) -> pa.Array | None:
    """One JSON object per row holding `columns` verbatim (strings stay strings)."""
    if not columns:
        return None
    cols = {c: table.column(c).to_pylist() for c in columns}
    return pa.array([json.dumps(dict(zip(columns, vals)), ensure_ascii=False) for vals in zip(*cols.values())],
                    pa.string())


def load_json(data: bytes, where: str = "", **at: Any) -> Any:
    """`data` as one JSON document; invalid JSON is an error saying `where` (e.g. 'line 3')."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise TraceError(f"{where}{': ' * bool(where)}invalid JSON ({str(e).split(';')[0][:120]})", **at) from None


_DECODER = json.JSONDecoder(parse_float=Num)  # one decoder: json.loads(parse_float=...) builds one per line


def jsonl_batches(path: Path, batch_rows: int = 50_000) -> Iterator[tuple[int, list[dict]]]:
    """Stream a JSON-lines file as (first row index, list of objects); blank lines skipped.
    Numbers with a fraction or exponent arrive as `Num` (their text is kept)."""
    check_file(path)
    batch, row0 = [], 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:  # (not `load_json`: a call per line costs 20% here)
                obj = _DECODER.decode(raw.decode("utf-8"))
            except (ValueError, RecursionError) as e:
                raise TraceError(f"line {lineno}: invalid JSON ({str(e).split(';')[0][:120]})", file=str(path)) from None
            if not isinstance(obj, dict):
                raise TraceError(f"line {lineno}: expected a JSON object, got {type(obj).__name__}", file=str(path))
            batch.append(obj)
            if len(batch) >= batch_rows:
                yield row0, batch
                row0, batch = row0 + len(batch), []
    if batch:
        yield row0, batch
    elif row0 == 0:
        raise TraceError("no JSON objects in the file", file=str(path))


def column(objs: list[dict], key: str, typ: pa.DataType, *, file: str, row0: int) -> pa.Array:
    """One field of a batch of JSON objects as an Arrow array of `typ` (missing -> null).
    Integer columns take JSON integers (or whole-valued numbers), never booleans or fractions."""
    vals = [o.get(key) for o in objs]
    if pa.types.is_integer(typ):
        try:  # fast path: Arrow infers int64 only when every value is a JSON integer (no bool/float)
            inferred = pa.array(vals)
            if pa.types.is_integer(inferred.type) or pa.types.is_null(inferred.type):
                return inferred.cast(typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        bad = [i for i, v in enumerate(vals) if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                                  or (isinstance(v, float) and not v.is_integer()))]
        if bad:
            raise TraceError(f"expected whole numbers, got {json.dumps(vals[bad[0]])[:60]}", file=file, column=key,
                             rows=[row0 + i for i in bad])
        vals = [int(v) if isinstance(v, float) else v for v in vals]
    try:
        return pa.array(vals, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        for i, v in enumerate(vals):
            try:
                pa.array([v], typ)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                raise TraceError(f"expected {typ}, got {json.dumps(v)[:60]}", file=file, column=key,
                                 rows=[row0 + i]) from None
        raise TraceError(f"expected {typ}: {str(e)[:120]}", file=file, column=key) from None


def objs_extra(objs: list[dict], known: set[str]) -> pa.Array | None:
    """`extra` for JSON objects: every key not in `known`, verbatim; None if there are none."""
    rests = [{k: v for k, v in o.items() if k not in known} for o in objs]
    text = [json.dumps(r, ensure_ascii=False) if r else None for r in rests]
    return pa.array(text, pa.string()) if any(rests) else None


def write_csv(table: pa.Table, out: Path, layout: dict | None = None) -> None:
    """CSV with the source's line terminator and final-newline convention (default: LF, final NL)."""
    layout = layout or {}
    eol = layout.get("line_terminator", "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:  # unquoted like the sources; quote only when a value needs it
        pcsv.write_csv(table, out, write_options=pcsv.WriteOptions(eol=eol, quoting_style="none", quoting_header="none"))
    except pa.ArrowInvalid:
        pcsv.write_csv(table, out, write_options=pcsv.WriteOptions(eol=eol, quoting_style="needed"))
    if not layout.get("final_newline", True):
        with open(out, "rb+") as f:
            f.truncate(out.stat().st_size - len(eol.encode()))


def extra_columns(table: pa.Table, names: list[str]) -> dict[str, list]:
    """Inverse of `extra_json`: the named keys of each row's `extra` (missing -> None)."""
    if "extra" not in table.column_names or not names:
        return {n: [None] * table.num_rows for n in names}
    rows = [json.loads(e) if e else {} for e in table.column("extra").to_pylist()]
    return {n: [r.get(n) for r in rows] for n in names}


def json_columns(objs: list[dict], fields: dict[str, tuple[str, pa.DataType]], time_key: str, unit_ns: int,
                 *, file: str, row0: int, required: tuple[str, ...] = (),
                 consumed: tuple[str, ...] = ()) -> dict[str, pa.Array]:
    """Canonical columns from a batch of JSON objects: `time_key` (decimal text in units of
    `unit_ns`) -> absolute `arrival_ns`; `fields` maps source key -> (column, type); every
    other key not in `consumed` goes to `extra` verbatim (always present, null where none)."""
    for key in (time_key, *required):
        if missing := [i for i, o in enumerate(objs) if o.get(key) is None]:
            raise TraceError(f"missing or null {key!r}", file=file, column=key, rows=[row0 + i for i in missing])
    text = pa.array([num_text(o[time_key]) for o in objs], pa.string())
    cols = {"arrival_ns": pa.array(decimal_ns(text, unit_ns, file=file, column=time_key, row0=row0), pa.int64())}
    for key, (name, typ) in fields.items():
        cols[name] = column(objs, key, typ, file=file, row0=row0)
    extra = objs_extra(objs, {time_key, *fields, *consumed})
    cols["extra"] = extra if extra is not None else pa.nulls(len(objs), pa.string())
    return cols


def arrival_process(opts: Any) -> dict[str, Any] | None:
    """The seeded arrival process `--rate R [--arrivals poisson|gamma:CV|weibull:CV] [--seed S]`
    asks for (a lengths-only source gets its arrivals from it); None when neither is given."""
    rate, spec = getattr(opts, "rate", None), getattr(opts, "arrivals", None)
    if rate is None and spec is None:
        return None
    if rate is None:
        raise TraceError("--arrivals needs --rate R (the mean request rate in req/s)")
    if not rate > 0:
        raise TraceError(f"--rate must be > 0, got {rate}")
    name, _, cv = (spec or "poisson").strip().lower().partition(":")
    proc: dict[str, Any] = {"synthesized": True, "process": name, "rate": float(rate),
                            "seed": int(getattr(opts, "seed", 0) or 0)}
    try:
        if name == "poisson" and not cv:
            return proc
        if name in ("gamma", "weibull") and float(cv) > 0:
            return {**proc, "cv": float(cv)}
    except ValueError:
        pass
    raise TraceError(f"--arrivals {spec!r}: expected poisson, gamma:CV or weibull:CV (CV > 0)")


def reject_arrival_options(opts: Any, what: str, hint: str = "import without them, then rescale with "
                           "`replay trace transform OUT --rate R -o ...`", **where: Any) -> None:
    """A source with its own arrival times cannot take --rate/--arrivals: say so, never ignore them."""
    if getattr(opts, "rate", None) is not None or getattr(opts, "arrivals", None) is not None:
        raise TraceError(f"--rate/--arrivals synthesize arrivals for lengths-only files, but {what}; {hint}", **where)


class SynthArrivals:
    """Arrival times (int64 ns from 0) of `arrival_process`'s renewal process, batch after batch
    from one seeded stream (the first request arrives at 0); records the process in `meta`."""

    def __init__(self, proc: dict[str, Any], meta: dict[str, Any]) -> None:
        self.t, self.first = 0, True
        self.rng = np.random.default_rng(proc["seed"])
        meta["source"]["arrivals"] = proc
        meta.update(time_origin_kind="synthetic", original_time_format={
            "kind": "none", "arrivals": proc["process"], **{k: v for k, v in proc.items() if k in ("rate", "seed", "cv")}})
        mean, cv = 1e9 / proc["rate"], proc.get("cv", 1.0)
        if proc["process"] == "gamma":
            self.draw = lambda n: self.rng.gamma(1 / cv**2, mean * cv**2, n)
        elif proc["process"] == "weibull":
            import math
            from scipy import optimize
            from ..spec_types import weibull_cv
            k = optimize.brentq(lambda s: weibull_cv(s) - cv, 0.05, 500.0) if abs(cv - 1) > 1e-12 else 1.0
            self.draw = lambda n: self.rng.weibull(k, n) * (mean / math.gamma(1 + 1 / k))
        else:
            self.draw = lambda n: self.rng.exponential(mean, n)

    def __call__(self, n: int) -> pa.Array:
        gaps = np.rint(self.draw(n)).astype(np.int64)
        if self.first and n:
            gaps[0], self.first = 0, False
        arr = self.t + np.cumsum(gaps)
        self.t = int(arr[-1]) if n else self.t
        return pa.array(arr, pa.int64())
