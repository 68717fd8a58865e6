"""The canonical trace schema (docs/architecture.md, Trace schema): one row per request, and
the row rules beyond the column types (prefix blocks vs prompt length, image count and sizes).

Everything else in `traces` (readers, importers, generators, transforms) produces
tables that conform to `TRACE_SCHEMA`; the runner consumes only this.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import TraceError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    required: bool
    nullable: bool


COLUMNS: tuple[Column, ...] = (   # each one's meaning: docs/architecture.md, Trace schema (a test compares them)
    Column("arrival_ns", pa.int64(), True, False),
    Column("input_tokens", pa.int32(), True, False),
    Column("output_tokens", pa.int32(), True, True),
    Column("request_id", pa.string(), False, False),
    Column("model", pa.dictionary(pa.int32(), pa.string()), False, True),
    Column("session_id", pa.string(), False, True),
    Column("turn", pa.int32(), False, True),
    Column("parent_id", pa.string(), False, True),
    Column("hash_ids", pa.list_(pa.int64()), False, True),
    Column("slo_class", pa.string(), False, True),
    Column("api", pa.string(), False, True),
    Column("prompt", pa.string(), False, True),
    Column("failed_in_source", pa.bool_(), False, True),
    Column("observed_latency_s", pa.float64(), False, True),
    Column("client_id", pa.string(), False, True),
    Column("num_images", pa.int16(), False, True),
    Column("image_px", pa.string(), False, True),
    Column("reasoning_tokens", pa.int32(), False, True),
    Column("task_id", pa.string(), False, True),
    Column("depends_on", pa.list_(pa.string()), False, True),
    Column("delay_s", pa.float64(), False, True),
    Column("extra", pa.string(), False, True),
)

# Images (multimodal requests). More than 64 images in one chat request is absurd: such a
# count is a mapping or unit mistake, and replay would build that many image parts per
# request. 8192 px a side bounds one image the same way (8192x8192 RGB is 200 MB raw).
MAX_IMAGES = 64
MAX_IMAGE_SIDE = 8192
# Tokens per request: input_tokens and output_tokens are each at most 2^24 = 16,777,216, above
# the longest context windows served today (1M-10M tokens); a larger count is a unit or mapping
# mistake (bytes for tokens), and replay would build a prompt of that many tokens. validate
# enforces it (`trace.conform`), generate caps at it.
MAX_TOKENS = 1 << 24
DEFAULT_IMAGE_PX = "512x512"       # what replay sends for a row with images and no image_px
IMAGE_PX_PATTERN = r"^\d+x\d+$"

BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
REQUIRED: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)
TRACE_SCHEMA = pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS])


def schema_for(names: list[str]) -> pa.Schema:
    """The canonical schema restricted to `names`, in canonical column order."""
    return pa.schema([TRACE_SCHEMA.field(n) for n in TRACE_SCHEMA.names if n in names])


def check_blocks(hash_ids: pa.Array | pa.ChunkedArray, input_tokens: pa.Array | pa.ChunkedArray, block_size: int,
                 *, file: str | None, row0: int = 0) -> None:
    """A request cannot hold more prefix blocks than ceil(input_tokens / block_size)."""
    n = pc.list_value_length(hash_ids).fill_null(0).to_numpy(zero_copy_only=False)
    cap = -(-np.asarray(input_tokens.to_numpy(zero_copy_only=False), dtype=np.float64) // block_size)
    if (bad := n > cap).any():
        raise TraceError(f"hash_ids has more blocks than ceil(input_tokens / {block_size}) allows",
                         file=file, column="hash_ids", rows=(np.flatnonzero(bad)[:11] + row0).tolist(),
                         total_rows=len(n) if row0 == 0 else None)


def check_num_images(col: pa.ChunkedArray, *, file: str | None) -> None:
    """0 <= num_images <= MAX_IMAGES (nulls are fine: no images). `col` holds int64 values, so
    that an absurd count is reported as such, not as an int16 overflow."""
    lo, hi = pc.min_max(col).as_py().values()  # cheap; rows are located only when it fails
    if lo is None or (lo >= 0 and hi <= MAX_IMAGES):
        return
    v = col.fill_null(0).to_numpy()
    rule = f">= 0 (got {lo})" if lo < 0 else f"<= {MAX_IMAGES}: more images in one request is absurd (got {hi})"
    raise TraceError(f"num_images must be {rule}", file=file, column="num_images", total_rows=len(v),
                     rows=np.flatnonzero(v < 0 if lo < 0 else v > MAX_IMAGES)[:11].tolist())


def _side_ok(side: pa.Array) -> pa.Array:
    """A side without leading zeros is in 1..MAX_IMAGE_SIDE iff it has 1-4 digits and is small
    enough (no int cast of a 30-digit string that could overflow)."""
    n = pc.utf8_length(side)
    short = pc.and_(pc.greater_equal(n, 1), pc.less_equal(n, len(str(MAX_IMAGE_SIDE))))
    value = pc.if_else(short, side, "0").cast(pa.int32())
    return pc.and_(short, pc.less_equal(value, MAX_IMAGE_SIDE))


def image_px_problems(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Masks over `values` (strings): not `WxH` digits; a side outside 1..MAX_IMAGE_SIDE
    (`0512x512` is 512 wide). Nulls pass both (null = the 512x512 default)."""
    fmt_ok = pc.match_substring_regex(values, IMAGE_PX_PATTERN)
    sides = pc.extract_regex(pc.if_else(fmt_ok, values, "1x1"), r"^0*(?P<w>\d*)x0*(?P<h>\d*)$")
    in_range = pc.and_(_side_ok(pc.struct_field(sides, "w")), _side_ok(pc.struct_field(sides, "h")))
    bad_fmt = pc.invert(fmt_ok).fill_null(False).to_numpy(zero_copy_only=False)
    bad_range = pc.invert(in_range).fill_null(False).to_numpy(zero_copy_only=False) & ~bad_fmt
    return bad_fmt, bad_range


def image_px_problem(px: str) -> str | None:
    """The rule a single `WxH` value breaks (spec fields), or None."""
    bad_fmt, bad_range = image_px_problems(pa.array([px], pa.string()))
    if bad_fmt[0]:
        return f"image size {px!r} must be WxH in pixels, e.g. 512x512"
    if bad_range[0]:
        return f"image size {px!r} must have both sides in 1..{MAX_IMAGE_SIDE} pixels"
    return None


def check_image_px(col: pa.ChunkedArray, *, file: str | None) -> None:
    """Every non-null image_px is `WxH` with both sides in 1..MAX_IMAGE_SIDE. Checked on the
    distinct values (a trace holds a handful of sizes), rows located only on failure."""
    values = pc.unique(col)
    for mask, rule in zip(image_px_problems(values),
                          ("image_px must be WxH in pixels, digits and a lowercase x, e.g. 512x512",
                           f"image_px sides must be in 1..{MAX_IMAGE_SIDE} pixels")):
        if mask.any():
            bad = values.filter(pa.array(mask))
            rows = np.flatnonzero(pc.is_in(col, value_set=bad).fill_null(False).to_numpy(zero_copy_only=False))
            first = col[int(rows[0])].as_py()
            raise TraceError(f"{rule} (got {first!r})", file=file, column="image_px",
                             rows=rows[:11].tolist(), total_rows=len(col))
