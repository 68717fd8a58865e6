"""Canonical CSV and JSONL traces (the columns of TRACE_SCHEMA, `arrival_ns` in ns).

`Trace.read/write` call these for `.csv` / `.jsonl` paths (a table and its metadata: `Trace`
checks them). Metadata travels in a sidecar `<file>.meta.json`. In CSV, `hash_ids` and
`depends_on` are written as JSON lists (`[1, 2, 3]`) and an empty cell is null; CSV columns
outside the schema are refused here (import them with `replay trace import csv`, which keeps
them in `extra`); unknown JSONL keys go to `extra`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa

from .errors import TraceError
from .schema import BY_NAME, REQUIRED


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def read_text(path: str | Path) -> tuple[pa.Table, dict]:
    from .importers import common, generic
    path = Path(path)
    fmt = "csv" if path.suffix.lower() == ".csv" else "jsonl"
    if fmt == "csv":
        names = common.csv_header(path)
        if unknown := [n for n in names if n not in BY_NAME]:
            raise TraceError(f"column(s) {', '.join(unknown)} are not trace columns; `replay trace import csv "
                             f"{path} --map ...` keeps them in 'extra'", file=str(path))
    keys = names if fmt == "csv" else list(next(generic.jsonl_batches(path))[1][0])  # (the first object's keys)
    if missing := [c for c in REQUIRED if c not in keys]:
        raise TraceError(f"missing required column(s) {', '.join(missing)}; present: {', '.join(keys) or 'none'}",
                         file=str(path))
    opts = argparse.Namespace(format=fmt, map="arrival_ns=arrival_ns:ns")
    table = pa.concat_tables(generic.read(path, opts, {"source": {}}), promote_options="permissive")
    if "extra" in table.column_names and table.column("extra").null_count == table.num_rows:
        table = table.drop_columns(["extra"])
    meta, mp = {}, _meta_path(path)
    if mp.exists():
        try:
            meta = json.loads(mp.read_text())
        except ValueError as e:
            raise TraceError(f"unreadable metadata sidecar: {e}", file=str(mp)) from None
    return table, meta


def write_text(t: pa.Table, metadata: dict, path: str | Path) -> None:
    from .importers.common import write_csv
    path = Path(path)
    if "model" in t.column_names:
        t = t.set_column(t.schema.get_field_index("model"), "model", t.column("model").cast(pa.string()))
    if path.suffix.lower() == ".csv":
        for name in ("hash_ids", "depends_on"):
            if name in t.column_names:
                text = [None if h is None else json.dumps(h) for h in t.column(name).to_pylist()]
                t = t.set_column(t.schema.get_field_index(name), name, pa.array(text, pa.string()))
        write_csv(t, path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for batch in t.to_batches(65536):
                for row in batch.to_pylist():
                    f.write(json.dumps({k: v for k, v in row.items() if v is not None}, ensure_ascii=False) + "\n")
    _meta_path(path).write_text(json.dumps(metadata, indent=1))
