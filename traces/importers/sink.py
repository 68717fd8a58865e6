"""Stream canonical batches into a Parquet trace with bounded memory.

Importers yield tables whose `arrival_ns` is absolute in the source's own clock (exact int64
ns); the sink subtracts the origin (the first arrival), validates each batch with `conform`
(errors name global data rows), and appends a row group. Sources without ids get none in the
file: readers fill `request_id` with the row index (the schema's rule), which saves writing
and compressing tens of millions of strings. The output
appears only when everything succeeded (written to `OUT.partial`, then renamed).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import TraceError
from ..schema import SCHEMA_VERSION
from ..trace import conform
from ..validate import unique_ids
from .timeparse import first_rows


def _arrivals(table: pa.Table, ns: np.ndarray) -> pa.Table:
    return table.set_column(table.schema.get_field_index("arrival_ns"), "arrival_ns", pa.array(ns, pa.int64()))


class TraceSink:
    """Write batches as they come; `sort=True` gathers them (in Arrow memory) and sorts at the end."""

    def __init__(self, out: Path, *, file: str, sort: bool = False, drop_failed: bool = False) -> None:
        self.out, self.file, self.sort, self.drop_failed = Path(out), file, sort, drop_failed
        self.tmp = self.out.with_name(self.out.name + ".partial")
        self.rows = self.source_rows = self.dropped = 0
        self.origin = self.last = self.schema = self.writer = None  # set by the first batch written
        self.held, self.ids = [], []  # tables kept for --sort; source-given ids, checked for uniqueness at close

    def write(self, table: pa.Table) -> None:
        row0 = self.source_rows
        self.source_rows += table.num_rows
        if self.drop_failed and "failed_in_source" in table.column_names:
            keep = pc.invert(pc.fill_null(table.column("failed_in_source"), False))
            self.dropped += table.num_rows - (pc.sum(keep.cast(pa.int64())).as_py() or 0)
            table = table.filter(keep)
        if table.num_rows == 0:
            return
        arr = table.column("arrival_ns").to_numpy().astype(np.int64)
        if "request_id" in table.column_names:
            self.ids.extend(table.column("request_id").cast(pa.string()).chunks)
        self.rows += table.num_rows
        if self.sort:
            self.held.append(table)
            return
        prev = np.concatenate([[self.last if self.last is not None else arr[0]], arr[:-1]])
        if (arr < prev).any():
            raise TraceError("arrival times must be non-decreasing (use --sort to sort the trace)",
                             file=self.file, column="arrival_ns", rows=first_rows(arr < prev, row0))
        self.origin = int(arr[0]) if self.origin is None else self.origin
        self.last = int(arr[-1])
        self._append(self._conform(_arrivals(table, arr - self.origin), row0))

    def _conform(self, table: pa.Table, row0: int) -> pa.Table:
        if self.schema is not None:  # every batch gets the first batch's columns
            new = set(table.column_names) - set(self.schema.names)
            if new:  # an importer bug, never silently dropped data
                raise RuntimeError(f"importer emitted column(s) {sorted(new)} missing from its first batch")
            for f in self.schema:
                if f.name not in table.column_names and f.name != "request_id":
                    table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
            table = table.select([c for c in self.schema.names if c in table.column_names])
        try:
            return conform(table, file=self.file, fill_request_id=False)
        except TraceError as e:
            rows = [r + row0 for r in e.rows] if e.rows is not None else None
            raise TraceError(e.rule, file=self.file, column=e.column, rows=rows) from None

    def _append(self, table: pa.Table) -> None:
        if self.writer is None:
            self.schema = table.schema
            self.out.parent.mkdir(parents=True, exist_ok=True)
            # zstd level 1: the same size as the default level here, in ~60% of the time
            self.writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd", compression_level=1)
        self.writer.write_table(table.cast(self.schema), row_group_size=1 << 20)

    def close(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """Finish the file; returns the metadata written (origin and row counts added)."""
        if self.sort and self.held:
            table = pa.concat_tables(self.held, promote_options="permissive")
            arr = table.column("arrival_ns").to_numpy().astype(np.int64)
            order = np.argsort(arr, kind="stable")
            self.origin = int(arr[order[0]])
            self._append(self._conform(_arrivals(table.take(order), arr[order] - self.origin), 0))
        if self.writer is None:
            raise TraceError("no requests in the input" + " after --drop-failed" * bool(self.dropped), file=self.file)
        if self.ids:
            unique_ids(self.ids, self.file)
        meta = {"schema_version": SCHEMA_VERSION, **metadata, "time_origin_ns": self.origin,
                "rows": {"source": self.source_rows, "written": self.rows, "dropped_failed": self.dropped}}
        self.writer.add_key_value_metadata({k: json.dumps(v) for k, v in meta.items()})
        self.writer.close()
        self.writer = None
        self.tmp.replace(self.out)
        return meta

    def __enter__(self) -> "TraceSink":
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is not None:  # a failed import leaves no output, not even the partial file
            if self.writer is not None:
                self.writer.close()
            self.tmp.unlink(missing_ok=True)
