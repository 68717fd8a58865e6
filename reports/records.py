"""Reading a run: records (validated against RECORD_SCHEMA), run.json, server metrics.

A run is a directory (`records.parquet`, optional `run.json`, `server_metrics.parquet`) or
just a records file (Parquet, or the Arrow IPC stream a killed run leaves behind).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import ReportError
from .schema import RECORD_SCHEMA, SERVER_METRICS_SCHEMA, STATUSES

RECORD_FILES = ("records.parquet", "records.arrow", "records.arrows")
IPC_SUFFIXES = (".arrow", ".arrows", ".ipc")
REQUIRED = tuple(f.name for f in RECORD_SCHEMA if not f.nullable)   # request_id, status
DICTIONARY_COLUMNS = ("model", "target_model", "target", "slo_class", "status")
# What the analysis (metrics, summary, gate, compare) reads. request_id is only shown in a few
# examples and is 10M strings at 10M records (~0.8 s to decode): it is read when asked (Run.column).
# trace_id likewise: read only to join a run's server spans (servertime.py).
ANALYSIS_COLUMNS = tuple(f.name for f in RECORD_SCHEMA if f.name not in ("request_id", "target_model",
                                                                          "session_id", "worker", "trace_id"))


@dataclass
class Run:
    """One run as read from disk; `dir` is None when only a records file was given."""
    dir: Path | None
    records_path: Path
    records: pa.Table
    config: dict | None
    server_metrics: pa.Table | None

    def column(self, name: str) -> pa.ChunkedArray:
        """A records column, read from the file if `records` was loaded without it."""
        if name in self.records.column_names:
            return self.records.column(name)
        table = _read_table(self.records_path, columns=[name])
        return conform_records(table, file=self.records_path, columns=[name]).column(name)

    def batches(self, columns, rows: int) -> Iterator[pa.Table]:
        """`columns` of the records, validated, about `rows` rows at a time in file order, read
        from the file as they are asked for (never whole in memory)."""
        path, names = self.records_path, list(columns)
        try:
            if path.suffix in IPC_SUFFIXES:        # memory-mapped: slices cost nothing
                parts = _read_table(path, columns=names).to_batches(max_chunksize=rows)
            else:
                pf = pq.ParquetFile(path, pre_buffer=False)
                parts = pf.iter_batches(batch_size=rows, columns=[c for c in names if c in pf.schema_arrow.names])
            for part in parts:
                yield conform_records(pa.Table.from_batches([part]), file=path, columns=names)
        except (pa.ArrowException, OSError) as e:
            raise ReportError(f"cannot read records: {e}", file=path) from None


def _records_path(path: Path) -> Path:
    if path.is_dir():
        for name in RECORD_FILES:
            if (path / name).exists():
                return path / name
        raise ReportError(f"no records file in the directory (expected one of {', '.join(RECORD_FILES)})", file=path)
    if not path.exists():
        raise ReportError("no such file or run directory", file=path)
    return path


def _read_table(path: Path, dictionary: bool = False, columns=None) -> pa.Table:
    """Read a records file (only `columns` that it has, when given); with `dictionary`,
    low-cardinality string columns come back dictionary-encoded (several times faster to
    decode, and already integer codes)."""
    try:
        if path.suffix in IPC_SUFFIXES:
            with pa.memory_map(str(path)) as src:
                try:
                    table = pa.ipc.open_file(src).read_all()
                except pa.ArrowInvalid:
                    src.seek(0)
                    table = _read_stream_prefix(src)
            return table if columns is None else table.select([c for c in columns if c in table.column_names])
        if columns is not None:
            names = pq.read_schema(path).names
            columns = [c for c in columns if c in names]
        # pre_buffer=False: column chunks are read as they are decoded, not all held at once
        # (10M records: peak RSS of the read 2.0 -> 1.4 GB, same time).
        return pq.read_table(path, columns=columns, pre_buffer=False,
                             read_dictionary=list(DICTIONARY_COLUMNS) if dictionary else None)
    except (pa.ArrowException, OSError) as e:
        raise ReportError(f"cannot read records: {e}", file=path) from None


def _parquet_nulls(path: Path, names) -> dict[str, tuple[int | None, int]]:
    """(nulls, rows) of each Parquet column in `names` that the file has, the nulls from the statistics
    without reading the column (None when a row group does not record them); {} for any other file."""
    try:
        md = pq.ParquetFile(path).metadata
    except (pa.ArrowException, OSError):     # not Parquet: an Arrow IPC file or stream
        return {}
    out = {}
    for j in range(md.num_columns):
        if (name := md.schema.column(j).path) in names:
            stats = [md.row_group(g).column(j).statistics for g in range(md.num_row_groups)]
            known = all(st is not None and st.has_null_count for st in stats)
            out[name] = (sum(st.null_count for st in stats) if known else None, md.num_rows)
    return out


def _read_stream_prefix(src) -> pa.Table:
    """An IPC stream from a killed run may end mid-batch: keep every complete batch."""
    reader, batches = pa.ipc.open_stream(src), []
    with suppress(pa.ArrowInvalid, OSError):     # keeps the batches read before the error
        batches.extend(reader)
    return pa.Table.from_batches(batches, schema=reader.schema)


def _conform(table: pa.Table, schema: pa.Schema, file: object, keep_dictionary: bool = False) -> pa.Table:
    """`table` cast to `schema`: columns it lacks become null (an error for a non-nullable one), extra ones
    are dropped; with `keep_dictionary`, dictionary-encoded string columns stay encoded (same values)."""
    missing = [f.name for f in schema if not f.nullable and f.name not in table.column_names]
    if missing:
        raise ReportError(f"missing required column(s) {', '.join(missing)}", file=file)
    cols, fields = [], []
    for field in schema:
        col = table.column(field.name) if field.name in table.column_names else pa.nulls(table.num_rows, field.type)
        if keep_dictionary and pa.types.is_dictionary(col.type) and field.type == pa.string() and \
                col.type.value_type in (pa.string(), pa.large_string()):
            field = field.with_type(col.type)
        elif col.type != field.type:
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise ReportError(f"has type {col.type}, expected {field.type} ({e})",
                                  file=file, field=field.name) from None
        cols.append(col)
        fields.append(field)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def conform_records(table: pa.Table, *, file: object = None, keep_dictionary: bool = False,
                    columns=None) -> pa.Table:
    """Cast `table` to RECORD_SCHEMA (`_conform`); null required fields and unknown statuses are errors
    naming the column and rows. With `columns`, only those columns of the schema (and the required
    ones the table has)."""
    schema = RECORD_SCHEMA if columns is None else pa.schema(
        [f for f in RECORD_SCHEMA if f.name in columns or (not f.nullable and f.name in table.column_names)])
    out = _conform(table, schema, file, keep_dictionary)
    for name in REQUIRED:
        if name in out.column_names and out.column(name).null_count:
            bad = np.flatnonzero(pc.is_null(out.column(name)).to_numpy(zero_copy_only=False))
            raise ReportError("must not be null", file=file, field=name, rows=bad, total_rows=out.num_rows)
    if "status" not in out.column_names:
        return out
    status = out.column("status")
    if pa.types.is_dictionary(status.type):   # check the few distinct values, not every row
        if {v for c in status.chunks for v in c.dictionary.to_pylist()} <= set(STATUSES):
            return out
        status = status.cast(status.type.value_type)
    ok_status = pc.is_in(status, value_set=pa.array(STATUSES))
    if not pc.all(ok_status).as_py():
        bad = np.flatnonzero(~ok_status.to_numpy(zero_copy_only=False))
        raise ReportError(f"unknown status (allowed: {', '.join(STATUSES)})", file=file,
                          field="status", rows=bad, total_rows=out.num_rows)
    return out


def load_records(path_or_run_dir: str | Path) -> pa.Table:
    """The records of a run directory or records file, validated against RECORD_SCHEMA."""
    path = _records_path(Path(path_or_run_dir))
    return conform_records(_read_table(path), file=path)


def load_run(path_or_run_dir: str | Path, columns=None) -> Run:
    """Records plus the optional run.json and server_metrics.parquet next to them. Low-cardinality
    string columns (model, target_model, slo_class, status) stay dictionary-encoded. With
    `columns` (e.g. ANALYSIS_COLUMNS), only those are read; a required column left out is still
    validated: from the Parquet statistics where they prove it has no null, else by reading it."""
    path = Path(path_or_run_dir)
    rec_path = _records_path(path)
    if columns is not None:
        nulls = _parquet_nulls(rec_path, (*REQUIRED, "task_id"))
        columns = [*columns, *(c for c in REQUIRED if c not in columns and nulls.get(c, (None, 0))[0] != 0)]
        n, rows = nulls.get("task_id", (0, 0))
        if "task_id" in columns and "request_id" not in columns and (n is None or n < rows):
            columns.append("request_id")   # task graphs name their dependencies by request_id
    records = conform_records(_read_table(rec_path, dictionary=True, columns=columns), file=rec_path,
                              keep_dictionary=True, columns=columns)
    run_dir = path if path.is_dir() else None
    config = metrics = None
    if run_dir is not None and (run_dir / "run.json").exists():
        try:
            config = json.loads((run_dir / "run.json").read_text())
        except (OSError, ValueError) as e:
            raise ReportError(f"cannot read run config: {e}", file=run_dir / "run.json") from None
    if run_dir is not None and (sm := run_dir / "server_metrics.parquet").exists():
        try:
            table = pq.read_table(sm)
        except (pa.ArrowException, OSError) as e:
            raise ReportError(f"cannot read server metrics: {e}", file=sm) from None
        metrics = _conform(table, SERVER_METRICS_SCHEMA, sm)
    return Run(run_dir, rec_path, records, config, metrics)
