"""The `Trace` type: a validated `pyarrow.Table` in the canonical schema plus metadata.

Parquet is canonical. Large files are consumed with `Trace.iter_batches`, which never
materialises the whole table (the runner holds only a window of the trace).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import TraceError
from .graph import check_graph, check_rows, parse_depends_on
from .io import read_text, write_text
from .schema import (BY_NAME, MAX_TOKENS, REQUIRED, SCHEMA_VERSION, check_blocks, check_image_px, check_num_images,
                     schema_for)

ROW_GROUP = 1 << 20                    # rows per Parquet row group
TEXT_SUFFIXES = (".csv", ".jsonl", ".ndjson")
# sorted or small-step integers: delta + bit-packing is smaller than zstd on plain values and
# 2-3x cheaper to write, so these columns are not compressed again (10M rows: write CPU -14%)
DELTA_COLUMNS = ("arrival_ns", "input_tokens", "output_tokens", "turn")
DICTIONARY_COLUMNS = ("model", "slo_class", "api", "client_id", "image_px")


def is_text_path(path: Path) -> bool:
    """CSV/JSONL by suffix; every other path is written as Parquet."""
    return path.suffix.lower() in TEXT_SUFFIXES


def with_schema_version(metadata: dict[str, Any] | None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, **(metadata or {})}


def parquet_writer(path: Path, schema: pa.Schema, metadata: dict[str, Any]) -> pq.ParquetWriter:
    """The canonical Parquet settings (Trace.write and the streaming generator share them).

    Dictionaries only where values repeat, statistics only on arrival_ns (row-group time
    ranges): both cost write time on the id strings and the 70M-element hash_ids lists for
    nothing (10M rows: write CPU -20%, same size). Write row groups of ROW_GROUP rows."""
    meta = {k.encode(): json.dumps(v).encode() for k, v in metadata.items()}
    names = schema.names
    delta = [c for c in DELTA_COLUMNS if c in names]
    compression = {c: "none" if c in delta else "zstd" for c in names}
    if "hash_ids" in names:  # a nested column's codec is set on its leaf
        compression["hash_ids.list.element"] = compression.pop("hash_ids")
    path.parent.mkdir(parents=True, exist_ok=True)
    return pq.ParquetWriter(path, schema.with_metadata(meta), compression=compression,
                            use_dictionary=[c for c in DICTIONARY_COLUMNS if c in names],
                            column_encoding={c: "DELTA_BINARY_PACKED" for c in delta},
                            write_statistics=["arrival_ns"])


def conform(table: pa.Table, *, file: str | None = None, sort: bool = False,
            fill_request_id: bool = True) -> pa.Table:
    """Cast `table` to the canonical schema and check every rule; raise TraceError otherwise.

    Unknown columns are an error here: importers move them into `extra` first.
    """
    n, names = table.num_rows, table.column_names

    def fail(column: str, rule: str, mask: np.ndarray | None = None, limit: int | None = 11) -> TraceError:
        """The error naming the rows of `mask` (the first `limit`: TraceError shows 10 and "more")."""
        return TraceError(rule, file=file, column=column, total_rows=n,
                          rows=None if mask is None else np.flatnonzero(mask)[:limit].tolist())

    if n == 0:
        raise TraceError("the trace is empty (0 rows)", file=file)
    if missing := [c for c in REQUIRED if c not in names]:
        raise TraceError(f"missing required column(s) {', '.join(missing)}; present: {', '.join(names) or 'none'}",
                         file=file)
    if unknown := [c for c in names if c not in BY_NAME]:
        raise TraceError(f"unknown column(s) {', '.join(unknown)}: not in the trace schema "
                         "(importers keep such columns in 'extra')", file=file)
    cols = {}
    for name in names:
        spec, col = BY_NAME[name], table.column(name)
        if isinstance(col.type, pa.DictionaryType) and not pa.types.is_dictionary(spec.type):
            col = col.dictionary_decode()
        if name == "depends_on":
            try:
                col = parse_depends_on(col)
            except TraceError as e:
                raise TraceError(e.rule, file=file, column=e.column, rows=e.rows, total_rows=n) from None
        if name == "num_images":  # range first: 1000 images is absurd, not an int16 overflow
            col = _cast(col, pa.int64(), name, fail)
            check_num_images(col, file=file)
        col = _cast(col, spec.type, name, fail)
        if not spec.nullable and col.null_count:
            raise fail(name, "must not be null", col.is_null().to_numpy(zero_copy_only=False))
        cols[name] = col
    arr = cols["arrival_ns"].to_numpy()
    if (arr < 0).any():
        raise fail("arrival_ns", "arrival_ns must be >= 0", arr < 0)
    for name in [c for c in ("input_tokens", "output_tokens", "reasoning_tokens") if c in cols]:
        lo, hi = pc.min_max(cols[name]).as_py().values()  # cheap; rows are located only when it fails
        if lo is not None and lo < 0:
            raise fail(name, f"{name} must be >= 0", cols[name].fill_null(0).to_numpy() < 0)
        if hi is not None and hi > MAX_TOKENS:
            raise fail(name, f"{name} must be <= {MAX_TOKENS:,} (2^24) tokens per request: no model takes more; a "
                       f"larger count is a unit or mapping mistake (got {hi:,})",
                       cols[name].fill_null(0).to_numpy() > MAX_TOKENS)
    if (down := np.diff(arr) < 0).any() and not sort:
        raise fail("arrival_ns", "arrival_ns must be non-decreasing (use --sort to sort the trace)",
                   np.append(False, down))
    if "reasoning_tokens" in cols:  # a part of the output: more than all of it is a mapping mistake
        over = pc.fill_null(pc.greater(cols["reasoning_tokens"], cols["output_tokens"]), False)
        if pc.any(over).as_py():
            i = int(np.argmax(v := over.to_numpy(zero_copy_only=False)))
            raise fail("reasoning_tokens", "reasoning_tokens must be <= output_tokens (they are a part of the output; "
                       f"got {cols['reasoning_tokens'][i].as_py()} > {cols['output_tokens'][i].as_py()})", v)
    if "image_px" in cols:
        check_image_px(cols["image_px"], file=file)
    if "depends_on" in cols or "delay_s" in cols:
        check_rows(cols, file, n)
    if "request_id" in cols:
        dup = pc.filter(vc := pc.value_counts(rid := cols["request_id"]), pc.greater(vc.field("counts"), 1))
        if len(dup):
            first = dup.field("values")[0].as_py()
            raise fail("request_id", f"request_id must be unique ({len(dup)} duplicated ids, e.g. {first!r})",
                       pc.equal(rid, first).to_numpy(zero_copy_only=False), limit=None)
    elif fill_request_id:  # unique by construction: no duplicate check
        cols["request_id"] = pa.chunked_array([pa.array(np.arange(n)).cast(pa.string())])
    out = pa.table(cols, schema=schema_for(list(cols)))
    return out.take(np.argsort(arr, kind="stable")) if down.any() else out


def _cast(col: pa.ChunkedArray, typ: pa.DataType, name: str, fail) -> pa.ChunkedArray:
    """`col` as `typ`; into integers only whole numbers in range, rows located only on failure."""
    t, integer = col.type, pa.types.is_integer(typ)
    if integer and pa.types.is_floating(t):
        v = col.to_numpy(zero_copy_only=False).astype(np.float64)
        if (nan := np.isnan(v) & ~col.is_null().to_numpy(zero_copy_only=False)).any():
            raise fail(name, "must not be NaN", nan)
        if (frac := (w := np.nan_to_num(v)) != np.round(w)).any():
            raise fail(name, "must be a whole number", frac)
    if integer and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        lim = int(np.iinfo(typ.to_pandas_dtype()).max)
        lo, hi = pc.min_max(col).as_py().values()  # cheap range check first
        if lo is not None and (abs(lo) > lim or abs(hi) > lim):
            v = col.to_numpy(zero_copy_only=False).astype(np.float64)
            raise fail(name, f"value overflows {typ}", np.abs(np.nan_to_num(v)) > lim)
    try:
        return col.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise fail(name, f"expected integers ({typ}), got {t}: {str(e)[:120]}" if integer else
                   f"cannot convert {t} to {typ}: {e}") from None


class Trace:
    """A validated trace: `table` in the canonical schema and JSON-able `metadata`."""

    def __init__(self, table: pa.Table, metadata: dict[str, Any] | None = None, *,
                 file: str | None = None, sort: bool = False, validate: bool = True) -> None:
        t = self.table = conform(table, file=file, sort=sort) if validate else table
        self.metadata: dict[str, Any] = with_schema_version(metadata)
        bs = self.metadata.get("block_size")
        if validate and bs and "hash_ids" in t.column_names:
            if not isinstance(bs, int) or bs < 1:
                raise TraceError(f"metadata block_size must be a positive integer, got {bs!r}", file=file)
            check_blocks(t.column("hash_ids"), t.column("input_tokens"), bs, file=file)
        if validate and "depends_on" in t.column_names:
            check_graph(t.column("request_id"), t.column("task_id") if "task_id" in t.column_names else None,
                        t.column("depends_on"), file=file)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    @property
    def duration_s(self) -> float:
        a = self.table.column("arrival_ns")
        return (a[-1].as_py() - a[0].as_py()) / 1e9 if len(a) else 0.0

    # --- Parquet (canonical) ------------------------------------------------------
    @classmethod
    def read(cls, path: str | Path, *, sort: bool = False) -> "Trace":
        """Read a trace file: Parquet, or CSV/JSONL in the canonical columns (by suffix)."""
        path = Path(path)   # (text files are read by the importers' code)
        table, meta = (read_text if path.suffix.lower() in (*TEXT_SUFFIXES, ".json") else _read_parquet)(path)
        return cls(table, meta, file=str(path), sort=sort)

    def write(self, path: str | Path) -> None:
        path = Path(path)
        if is_text_path(path):
            write_text(self.table, self.metadata, path)
            return
        from .pages import reused_pages
        with reused_pages(), parquet_writer(path, self.table.schema, self.metadata) as writer:
            writer.write_table(self.table, row_group_size=ROW_GROUP)

    @staticmethod
    def read_metadata(path: str | Path) -> dict[str, Any]:
        """The file's key-value metadata (streaming writers set it at close)."""
        return _decode_meta(_parquet_file(path).metadata.metadata or {})

    @staticmethod
    def iter_batches(path: str | Path, *, batch_size: int = 65536, columns: list[str] | None = None,
                     use_threads: bool = True) -> Iterator[pa.RecordBatch]:
        """Stream a Parquet trace in record batches with bounded memory (`use_threads=False`:
        decode in the calling thread only)."""
        f = _parquet_file(path)
        if columns is not None:
            columns = [c for c in columns if c in f.schema_arrow.names]
        yield from f.iter_batches(batch_size=batch_size, columns=columns, use_threads=use_threads)

    def __repr__(self) -> str:
        return f"Trace({self.num_rows} rows, {self.duration_s:.1f}s, columns={self.table.column_names})"


def _parquet_file(path: str | Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise not_parquet(path, e) from None


def not_parquet(path: str | Path, e: Exception) -> TraceError:
    """The error for a file that is no Parquet trace; a text file (a CSV or JSON source given
    where a trace goes) gets the way to import it."""
    hint = ""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
        binary = set(range(9)) | set(range(14, 32)) | {127}
        if head and not head.startswith(b"PAR1") and not binary.intersection(head):
            kind = "JSON" if head.lstrip()[:1] in (b"{", b"[") else "CSV" if b"," in head else "text"
            hint = (f"; it looks like {kind}: import it first, e.g. `replay trace import azure {path} -o "
                    f"t.parquet` (formats: `replay trace import --help`)")
    except OSError:
        pass
    return TraceError(f"not a readable Parquet file: {str(e)[:200]}{hint}", file=str(path))


def _decode_meta(raw: dict[bytes, bytes]) -> dict[str, Any]:
    out = {}
    for k, v in raw.items():
        key = k.decode(errors="replace")
        if key.startswith("ARROW:") or key == "pandas":
            continue
        try:
            out[key] = json.loads(v)
        except ValueError:
            out[key] = v.decode(errors="replace")
    return out


def _read_parquet(path: Path) -> tuple[pa.Table, dict[str, Any]]:
    if not path.exists():
        raise TraceError("file not found", file=str(path))
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise not_parquet(path, e) from None
    meta = _decode_meta(table.schema.metadata or {})
    try:  # streaming writers (importers) add their metadata to the file footer at close
        meta.update(_decode_meta(pq.read_metadata(path).metadata or {}))
    except (OSError, pa.ArrowException):
        pass
    return table.replace_schema_metadata(None), meta
