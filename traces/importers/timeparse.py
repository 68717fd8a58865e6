"""Exact time parsing and formatting for the importers.

Times are converted to integer nanoseconds from their decimal or ISO-8601 text (never through
float), so `0.1` s is exactly 100_000_000 ns and 7-digit Azure fractions keep their last digit;
the formatters write them back in the source's own format.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import TraceError

UNIT_NS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9}
_DECIMAL = r"^\s*(?P<sign>[-+]?)(?P<int>\d*)(?:\.(?P<frac>\d*))?(?:[eE](?P<exp>[-+]?\d{1,3}))?\s*$"
_ISO = (r"^(?P<date>\d{4}-\d{2}-\d{2})(?P<sep>[T ])(?P<time>\d{2}:\d{2}:\d{2})"
        r"(?:\.(?P<frac>\d{1,9}))?(?P<zone>Z|[+-]\d{2}:\d{2})?$")


def first_rows(mask: np.ndarray, row0: int) -> list[int]:
    """The first 11 rows where `mask` holds, as data rows of the file (the errors' `rows`)."""
    return (np.flatnonzero(mask)[:11] + row0).tolist()


class Num(float):
    """A JSON number that remembers its source text (for exact time conversion)."""

    text: str

    def __new__(cls, text: str) -> "Num":
        obj = super().__new__(cls, text)
        obj.text = text
        return obj


def num_text(v: Any) -> str | None:
    """Decimal text of a JSON value for `decimal_ns` (None stays None; strings verbatim)."""
    return None if v is None else v.text if isinstance(v, Num) else "not a number" if isinstance(v, bool) else str(v)


def decimal_ns(arr: pa.Array | pa.ChunkedArray, unit_ns: int, *, file: str, column: str,
               row0: int = 0) -> np.ndarray:
    """Exact integer ns from decimal text (`12`, `-0.5`, `1.25e3`) in units of `unit_ns`.
    Sub-nanosecond digits are rounded half up; anything else that is not a number is an error."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.string())  # (numbers, large_string)
    m = pc.extract_regex(arr, _DECIMAL)
    sign, ip, fp, ep = (m.field(k) for k in ("sign", "int", "frac", "exp"))
    bad = m.is_null().to_numpy(zero_copy_only=False)
    if not bad.any():
        bad = ((pc.utf8_length(ip).to_numpy() + pc.utf8_length(fp).to_numpy()) == 0)
    if bad.any():
        raise TraceError("not a number", file=file, column=column, rows=first_rows(bad, row0))
    fp = pc.utf8_rtrim(fp, characters="0")
    digits = pc.utf8_ltrim(pc.binary_join_element_wise(ip, fp, ""), characters="0")
    nd = pc.utf8_length(digits).to_numpy()
    if (nd > 18).any():
        raise TraceError("too many significant digits for exact nanoseconds", file=file, column=column,
                         rows=first_rows(nd > 18, row0))
    mant = pc.if_else(pc.equal(digits, ""), "0", digits).cast(pa.int64()).to_numpy()
    exp = pc.if_else(pc.equal(ep, ""), "0", pc.replace_substring(ep, "+", "")).cast(pa.int64()).to_numpy()
    shift = exp + int(round(np.log10(unit_ns))) - pc.utf8_length(fp).to_numpy()
    out = np.zeros(len(mant), dtype=np.int64)
    up, down = shift >= 0, shift < 0
    with np.errstate(over="ignore"):
        big = up & ((shift > 18) | (mant.astype(np.float64) * 10.0 ** np.minimum(shift, 300) > 9.2e18))
    if big.any():
        raise TraceError("time overflows int64 nanoseconds", file=file, column=column, rows=first_rows(big, row0))
    out[up] = mant[up] * 10 ** shift[up]
    d = 10 ** np.minimum(-shift[down], 18)
    q, r = np.divmod(mant[down], d)
    out[down] = q + (2 * r >= d)
    return np.where(sign.to_numpy(zero_copy_only=False) == "-", -out, out)


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
    """Slow path of `iso_ns`: one regex per row finds the offending rows and the format; pandas
    parses the (then valid) text, mixed zones included."""
    import pandas as pd
    m = pc.extract_regex(arr, _ISO)
    bad = m.is_null().to_numpy(zero_copy_only=False)
    if bad.any():
        ex = arr[int(np.flatnonzero(bad)[0])].as_py()
        raise TraceError(f"not an ISO-8601 timestamp (e.g. {ex!r}; expected YYYY-MM-DD hh:mm:ss[.fffffff][Z|+hh:mm])",
                         file=file, column=column, rows=first_rows(bad, row0))
    ts = pd.to_datetime(arr.to_pandas(), format="ISO8601", utc=True, errors="coerce")  # naive = UTC, exact to the ns
    bad = (ts.isna() | (ts < pd.Timestamp.min.tz_localize("UTC")) | (ts > pd.Timestamp.max.tz_localize("UTC"))).to_numpy()
    if bad.any():
        ex = arr[int(np.flatnonzero(bad)[0])].as_py()
        raise TraceError(f"invalid date or time (e.g. {ex!r}; int64 ns hold the years 1678-2261)", file=file,
                         column=column, rows=first_rows(bad, row0))
    ns = pd.DatetimeIndex(ts).as_unit("ns").asi8
    fmt = {"kind": "iso8601", "sep": pc.unique(m.field("sep")).to_pylist(),
           "fraction_digits": [int(d) for d in np.unique(pc.utf8_length(m.field("frac")).to_numpy())],
           "zones": sorted(pc.unique(m.field("zone")).to_pylist())}
    return ns, fmt


def merge_time_format(acc: dict | None, fmt: dict) -> dict:
    """Union of the ISO formats seen over batches (mixed formats are recorded, not hidden)."""
    if acc is None:
        return fmt
    return {"kind": "iso8601", **{k: sorted(set(acc[k]) | set(fmt[k])) for k in ("sep", "fraction_digits", "zones")}}


def format_iso(ns: np.ndarray, fmt: dict | None) -> pa.Array:
    """ISO-8601 text for epoch ns in the recorded source format (the inverse of `iso_ns`):
    the source's separator, its fraction width (omitted when zero if the source did that),
    and its zone suffix (any `+hh:mm` offset is written as UTC `+00:00`)."""
    if not fmt or "sep" not in fmt:   # a source whose time was decimal, float or none: the default
        fmt = {"sep": [" "], "fraction_digits": [9], "zones": [""]}
    sep = fmt["sep"][0] if len(fmt["sep"]) == 1 else " "
    digits = max(fmt["fraction_digits"])
    zones = [z for z in fmt["zones"] if z]
    zone = "" if not zones else ("Z" if zones == ["Z"] else "+00:00")
    ns = np.asarray(ns, dtype=np.int64)
    text = pc.strftime(pa.array(ns).cast(pa.timestamp("ns")), format=f"%Y-%m-%d{sep}%H:%M:%S")  # ss.fffffffff
    text = pc.utf8_slice_codeunits(text, 0, 20 + digits if digits else 19)  # the fraction cut, not rounded
    if 0 in fmt["fraction_digits"]:  # the source omits a zero fraction
        text = pc.if_else(pa.array(ns % 10**9 == 0), pc.utf8_slice_codeunits(text, 0, 19), text)
    return pc.binary_join_element_wise(text, zone, "") if zone else text


def decimal_text(ns: np.ndarray, unit_ns: int) -> pa.Array:
    """Absolute ns as the shortest exact decimal text in `unit_ns` units (`40`, `185.25`)."""
    whole, frac = np.divmod(np.asarray(ns, dtype=np.int64), unit_ns)
    w = pa.array(whole).cast(pa.string())
    frac_s = pc.utf8_rtrim(pc.utf8_lpad(pa.array(frac).cast(pa.string()), len(str(unit_ns)) - 1, "0"), characters="0")
    return pc.if_else(pa.array(frac == 0), w, pc.binary_join_element_wise(w, frac_s, "."))


def ns_to_decimal(ns: np.ndarray, unit_ns: int) -> list[int | float]:
    """Absolute ns as JSON numbers in `unit_ns` units: ints when whole, else the float whose
    shortest repr is the exact decimal (so `json.dumps` writes e.g. 1.234 back verbatim)."""
    return [float(x) if "." in x else int(x) for x in decimal_text(ns, unit_ns).to_pylist()]
