"""Parsing helpers shared by the importers: streamed CSV/JSONL, exact time parsing, `extra`.

Times are converted to integer nanoseconds from their decimal text (never through float),
so `0.1` s is exactly 100_000_000 ns and 7-digit Azure fractions keep their last digit.
"""
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
from ..validate import check_blocks  # noqa: F401 - importers use it from here

UNIT_NS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9}
CSV_BLOCK = 16 << 20
_DECIMAL = r"^\s*(?P<sign>[-+]?)(?P<int>\d*)(?:\.(?P<frac>\d*))?(?:[eE](?P<exp>[-+]?\d{1,3}))?\s*$"
_ISO = (r"^(?P<date>\d{4}-\d{2}-\d{2})(?P<sep>[T ])(?P<time>\d{2}:\d{2}:\d{2})"
        r"(?:\.(?P<frac>\d{1,9}))?(?P<zone>Z|[+-]\d{2}:\d{2})?$")


def _rows(mask: np.ndarray, row0: int) -> list[int]:
    return (np.flatnonzero(mask)[:11] + row0).tolist()


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
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TraceError(f"duplicate CSV column name(s) {dup}", file=str(path))
    return names


def csv_batches(path: Path, types: dict[str, pa.DataType], required: list[str]) -> tuple[list[str], Iterator[pa.Table]]:
    """Stream a CSV in ~16 MB blocks. Columns in `types` are parsed by Arrow with that type,
    every other column is kept as its verbatim string. CRLF and a missing final newline are fine."""
    names = csv_header(path)
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(f"missing column(s) {', '.join(missing)}; the header has: {', '.join(names)}",
                         file=str(path))
    col_types = {n: types.get(n, pa.string()) for n in names}

    def gen() -> Iterator[pa.Table]:
        try:
            reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=CSV_BLOCK),
                                   convert_options=pcsv.ConvertOptions(column_types=col_types,
                                                                       strings_can_be_null=False))
            for batch in reader:
                yield pa.Table.from_batches([batch])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError) as e:
            raise _csv_error(path, e, types) from None
    return names, gen()


def _csv_error(path: Path, e: Exception, types: dict[str, pa.DataType]) -> TraceError:
    """Turn an Arrow CSV error into one naming the column and data rows (cold path: rescans)."""
    msg = str(e).split("\n")[0][:300]
    if "conversion error" in msg:
        for name, typ in types.items():
            bad = _first_unparsable(path, name, typ)
            if bad:
                return TraceError(f"expected {typ} values: {msg}", file=str(path), column=name, rows=bad)
    return TraceError(f"not a valid CSV file: {msg}", file=str(path))


def _first_unparsable(path: Path, name: str, typ: pa.DataType) -> list[int]:
    try:
        t = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
            column_types={name: pa.string()}, include_columns=[name], strings_can_be_null=True))
    except (pa.ArrowInvalid, KeyError):
        return []
    s = t.column(name).combine_chunks()
    pattern = r"^\s*[-+]?\d+\s*$" if pa.types.is_integer(typ) else r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
    ok = pc.match_substring_regex(s, pattern).fill_null(True).to_numpy(zero_copy_only=False)
    return _rows(~ok, 0)


def decimal_ns(arr: pa.Array | pa.ChunkedArray, unit_ns: int, *, file: str, column: str,
               row0: int = 0) -> np.ndarray:
    """Exact integer ns from decimal text (`12`, `-0.5`, `1.25e3`) in units of `unit_ns`.
    Sub-nanosecond digits are rounded half up; anything else that is not a number is an error."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    m = pc.extract_regex(arr, _DECIMAL)
    sign, ip, fp, ep = (m.field(k) for k in ("sign", "int", "frac", "exp"))
    bad = m.is_null().to_numpy(zero_copy_only=False)
    if not bad.any():
        bad = ((pc.utf8_length(ip).to_numpy() + pc.utf8_length(fp).to_numpy()) == 0)
    if bad.any():
        raise TraceError("not a number", file=file, column=column, rows=_rows(bad, row0))
    fp = pc.utf8_rtrim(fp, characters="0")
    digits = pc.utf8_ltrim(pc.binary_join_element_wise(ip, fp, ""), characters="0")
    nd = pc.utf8_length(digits).to_numpy()
    if (nd > 18).any():
        raise TraceError("too many significant digits for exact nanoseconds", file=file, column=column,
                         rows=_rows(nd > 18, row0))
    mant = pc.if_else(pc.equal(digits, ""), "0", digits).cast(pa.int64()).to_numpy()
    exp = pc.if_else(pc.equal(ep, ""), "0", pc.replace_substring(ep, "+", "")).cast(pa.int64()).to_numpy()
    shift = exp + int(round(np.log10(unit_ns))) - pc.utf8_length(fp).to_numpy()
    out = np.zeros(len(mant), dtype=np.int64)
    up, down = shift >= 0, shift < 0
    with np.errstate(over="ignore"):
        big = up & ((shift > 18) | (mant.astype(np.float64) * 10.0 ** np.minimum(shift, 300) > 9.2e18))
    if big.any():
        raise TraceError("time overflows int64 nanoseconds", file=file, column=column, rows=_rows(big, row0))
    out[up] = mant[up] * 10 ** shift[up]
    d = 10 ** np.minimum(-shift[down], 18)
    q, r = np.divmod(mant[down], d)
    out[down] = q + (2 * r >= d)
    neg = (sign.to_numpy(zero_copy_only=False) == "-")
    return np.where(neg, -out, out)


def iso_ns(arr: pa.Array | pa.ChunkedArray, *, file: str, column: str, row0: int = 0) -> tuple[np.ndarray, dict]:
    """Exact ns since the Unix epoch from ISO-8601 text (naive = UTC, `Z`, `+hh:mm`; 0-9
    fraction digits) and the format seen: separator, fraction digits, zone suffixes.

    Hot path (10M-row Azure files): Arrow's own ISO parser casts the whole column (exact to
    the ns); the format is read off one sample per distinct (length, separator), since the
    Azure formats are fixed-width per variant. Anything Arrow refuses, mixed naive/zoned
    columns, or a sample outside the accepted grammar falls back to the per-row regex."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    ts = None
    for typ in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
        try:
            ts = arr.cast(typ)
            break
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    if ts is None or ts.null_count != arr.null_count or arr.null_count:
        return _iso_ns_regex(arr, file=file, column=column, row0=row0)
    keys = pa.table({"i": np.arange(len(arr)), "n": pc.utf8_length(arr), "sep": pc.utf8_slice_codeunits(arr, 10, 11)})
    idx = keys.group_by(["n", "sep"], use_threads=False).aggregate([("i", "min")]).column("i_min").to_numpy()
    try:
        _, fmt = _iso_ns_regex(arr.take(pa.array(idx)), file=file, column=column)
    except TraceError:
        return _iso_ns_regex(arr, file=file, column=column, row0=row0)
    return ts.cast(pa.int64()).to_numpy(), fmt


def _iso_ns_regex(arr: pa.Array, *, file: str, column: str, row0: int = 0) -> tuple[np.ndarray, dict]:
    """Slow path of `iso_ns`: one regex per row; finds the offending rows, handles mixed zones."""
    m = pc.extract_regex(arr, _ISO)
    bad = m.is_null().to_numpy(zero_copy_only=False)
    if bad.any():
        ex = arr[int(np.flatnonzero(bad)[0])].as_py()
        raise TraceError(f"not an ISO-8601 timestamp (e.g. {ex!r}; expected YYYY-MM-DD hh:mm:ss[.fffffff][Z|+hh:mm])",
                         file=file, column=column, rows=_rows(bad, row0))
    zone, frac = m.field("zone"), m.field("frac")
    base = pc.binary_join_element_wise(m.field("date"), m.field("time"), "T")
    try:
        secs = base.cast(pa.timestamp("s")).cast(pa.int64()).to_numpy()
    except pa.ArrowInvalid as e:
        raise TraceError(f"invalid date or time: {str(e)[:200]}", file=file, column=column) from None
    nd = pc.utf8_length(frac).to_numpy()
    frac_ns = pc.utf8_rpad(pc.if_else(pc.equal(frac, ""), "0", frac), 9, "0").cast(pa.int64()).to_numpy()
    off = np.zeros(len(arr), dtype=np.int64)
    has = pc.equal(pc.utf8_length(zone), 6)
    if pc.any(has).as_py():
        hh = pc.utf8_slice_codeunits(zone, 1, 3)
        mm = pc.utf8_slice_codeunits(zone, 4, 6)
        mins = pc.add(pc.multiply(pc.if_else(has, hh, "0").cast(pa.int64()), 60),
                      pc.if_else(has, mm, "0").cast(pa.int64())).to_numpy()
        sgn = np.where(pc.starts_with(zone, "-").to_numpy(zero_copy_only=False), -1, 1)
        off = sgn * mins * 60
    ns = (secs - off) * 10**9 + frac_ns
    digits = np.unique(nd)
    fmt = {"kind": "iso8601", "sep": pc.unique(m.field("sep")).to_pylist(),
           "fraction_digits": [int(d) for d in digits],
           "zones": sorted(pc.unique(zone).to_pylist())}
    return ns, fmt


def merge_time_format(acc: dict | None, fmt: dict) -> dict:
    """Union of the ISO formats seen over batches (mixed formats are recorded, not hidden)."""
    if acc is None:
        return fmt
    return {"kind": "iso8601", **{k: sorted(set(acc[k]) | set(fmt[k])) for k in ("sep", "fraction_digits", "zones")}}


def extra_json(table: pa.Table, columns: list[str]) -> pa.Array | None:
    """One JSON object per row holding `columns` verbatim (strings stay strings)."""
    if not columns:
        return None
    cols = {c: table.column(c).to_pylist() for c in columns}
    return pa.array([json.dumps(dict(zip(columns, vals)), ensure_ascii=False) for vals in zip(*cols.values())],
                    pa.string())


class Num(float):
    """A JSON number that remembers its source text (for exact time conversion)."""

    text: str

    def __new__(cls, text: str) -> "Num":
        obj = super().__new__(cls, text)
        obj.text = text
        return obj


def num_text(v: Any) -> str | None:
    """Decimal text of a JSON value for `decimal_ns` (None stays None; strings verbatim)."""
    if v is None:
        return None
    if isinstance(v, Num):
        return v.text
    if isinstance(v, bool):
        return "not a number"
    return str(v)


def jsonl_batches(path: Path, batch_rows: int = 50_000) -> Iterator[tuple[int, list[dict]]]:
    """Stream a JSON-lines file as (first row index, list of objects); blank lines skipped.
    Numbers with a fraction or exponent arrive as `Num` (their text is kept)."""
    check_file(path)
    batch: list[dict] = []
    row0 = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw, parse_float=Num)
            except (ValueError, RecursionError) as e:
                raise TraceError(f"line {lineno}: invalid JSON ({str(e)[:120]})", file=str(path)) from None
            if not isinstance(obj, dict):
                raise TraceError(f"line {lineno}: expected a JSON object, got {type(obj).__name__}", file=str(path))
            batch.append(obj)
            if len(batch) >= batch_rows:
                yield row0, batch
                row0 += len(batch)
                batch = []
    if batch:
        yield row0, batch
    elif row0 == 0:
        raise TraceError("no JSON objects in the file", file=str(path))


def column(objs: list[dict], key: str, typ: pa.DataType, *, file: str, row0: int) -> pa.Array:
    """One field of a batch of JSON objects as an Arrow array of `typ` (missing -> null).
    Integer columns take JSON integers (or whole-valued numbers), never booleans or fractions."""
    vals = [o.get(key) for o in objs]
    if pa.types.is_integer(typ):
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
    out, any_extra = [], False
    for o in objs:
        rest = {k: v for k, v in o.items() if k not in known}
        any_extra = any_extra or bool(rest)
        out.append(json.dumps(rest, ensure_ascii=False) if rest else None)
    return pa.array(out, pa.string()) if any_extra else None


def format_iso(ns: np.ndarray, fmt: dict | None) -> pa.Array:
    """ISO-8601 text for epoch ns in the recorded source format (the inverse of `iso_ns`):
    the source's separator, its fraction width (omitted when zero if the source did that),
    and its zone suffix (any `+hh:mm` offset is written as UTC `+00:00`)."""
    fmt = fmt or {"sep": [" "], "fraction_digits": [9], "zones": [""]}
    sep = fmt["sep"][0] if len(fmt["sep"]) == 1 else " "
    digits = max(fmt["fraction_digits"])
    omit_zero = 0 in fmt["fraction_digits"]
    zones = [z for z in fmt["zones"] if z]
    zone = "" if not zones else ("Z" if zones == ["Z"] else "+00:00")
    ns = np.asarray(ns, dtype=np.int64)
    secs, frac = np.divmod(ns, 10**9)
    base = pc.strftime(pa.array(secs, pa.int64()).cast(pa.timestamp("s")), format=f"%Y-%m-%d{sep}%H:%M:%S")
    if digits:
        fs = pc.utf8_lpad(pa.array(frac // 10 ** (9 - digits)).cast(pa.string()), digits, "0")
        fs = pc.binary_join_element_wise(".", fs, "")
        if omit_zero:
            fs = pc.if_else(pa.array(frac == 0), "", fs)
        base = pc.binary_join_element_wise(base, fs, "")
    return pc.binary_join_element_wise(base, zone, "") if zone else base


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
        missing = [i for i, o in enumerate(objs) if o.get(key) is None]
        if missing:
            raise TraceError(f"missing or null {key!r}", file=file, column=key, rows=[row0 + i for i in missing])
    text = pa.array([num_text(o[time_key]) for o in objs], pa.string())
    cols = {"arrival_ns": pa.array(decimal_ns(text, unit_ns, file=file, column=time_key, row0=row0), pa.int64())}
    for key, (name, typ) in fields.items():
        cols[name] = column(objs, key, typ, file=file, row0=row0)
    extra = objs_extra(objs, {time_key, *fields, *consumed})
    cols["extra"] = extra if extra is not None else pa.nulls(len(objs), pa.string())
    return cols


def ns_to_decimal(ns: np.ndarray, unit_ns: int) -> list[int | float]:
    """Absolute ns as JSON numbers in `unit_ns` units: ints when whole, else the float whose
    shortest repr is the exact decimal (so `json.dumps` writes e.g. 1.234 back verbatim)."""
    whole, frac = np.divmod(np.asarray(ns, dtype=np.int64), unit_ns)
    digits = len(str(unit_ns)) - 1
    out: list[int | float] = whole.tolist()
    for i in np.flatnonzero(frac):
        out[i] = float(f"{whole[i]}.{int(frac[i]):0{digits}d}")
    return out
