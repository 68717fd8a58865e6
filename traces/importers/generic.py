"""Generic CSV / JSONL with a column mapping: `--map arrival=ts:ms,input_tokens=prompt_len,...`.

Targets are canonical column names (`arrival` = `arrival_ns`, with a unit `s|ms|us|ns|iso`
for the source column); source columns already named like canonical columns map to
themselves; every other source column is kept verbatim in `extra`. `hash_ids` in a CSV cell
is a list like `[1, 2, 3]` (or `1 2 3`). A lengths-only file (no arrival column) takes
`--rate R [--arrivals poisson|gamma:CV|weibull:CV] [--seed S]` for seeded arrivals. Also the
reader behind canonical CSV/JSONL traces.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import TraceError
from ..schema import BY_NAME
from .common import (SynthArrivals, arrival_process, column, csv_header, csv_tables, jsonl_batches,
                     objs_extra, reject_arrival_options)
from .timeparse import UNIT_NS, decimal_ns, iso_ns, merge_time_format, num_text

DOC = "any CSV or JSON-lines file, columns mapped with --map target=source[:unit]"
SYNTH_ARRIVALS = True  # accepts --rate/--arrivals (for files without an arrival column)


def parse_map(spec: str | None, names: list[str], opts: Any = None, file: str | None = None
              ) -> tuple[dict[str, str], str | None]:
    """{canonical: source} and the arrival unit, from `--map` and the source's column names.
    Without an arrival column the arrivals come from `--rate`/`--arrivals` in `opts`."""
    mapping: dict[str, str] = {n: n for n in names if n in BY_NAME}
    unit = "ns"
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        target, sep, source = item.partition("=")
        target = target.strip()
        if not sep or not source:
            raise TraceError(f"--map item {item!r} must look like target=source[:unit]")
        if target in ("arrival", "arrival_ns"):
            target = "arrival_ns"
            source, _, u = source.partition(":")
            unit = u or "s"
            if unit not in UNIT_NS and unit != "iso":
                raise TraceError(f"--map arrival unit {unit!r} must be one of s, ms, us, ns, iso")
        elif target not in BY_NAME or target == "extra":
            raise TraceError(f"--map target {target!r} is not a trace column; "
                             f"use one of arrival, {', '.join(c for c in BY_NAME if c not in ('arrival_ns', 'extra'))}")
        if source not in names:
            raise TraceError(f"--map source column {source!r} is not in the input; it has: {', '.join(names)}")
        mapping = {k: v for k, v in mapping.items() if v != source}
        mapping[target] = source
    synth = arrival_process(opts) is not None
    if "arrival_ns" in mapping:
        reject_arrival_options(opts, f"this file has an arrival column ({mapping['arrival_ns']})", file=file)
    elif not synth:
        raise TraceError("no arrival column: map one with --map arrival=COLUMN:UNIT (s, ms, us, ns or iso), or give "
                         "--rate R [--arrivals poisson|gamma:CV|weibull:CV] for seeded arrivals", file=file)
    for req in ("input_tokens", "output_tokens"):
        if req not in mapping:
            raise TraceError(f"no {req} column: map one with --map {req}=COLUMN", file=file)
    return mapping, unit if "arrival_ns" in mapping else None


def _arrival(col: Any, unit: str, meta: dict, file: str, source: str, row0: int) -> pa.Array:
    if unit == "iso":
        ns, fmt = iso_ns(col, file=file, column=source, row0=row0)
        meta["original_time_format"] = merge_time_format(meta.get("original_time_format"), fmt)
    else:
        ns = decimal_ns(col, UNIT_NS[unit], file=file, column=source, row0=row0)
    return pa.array(ns, pa.int64())


def _hash_ids(col: pa.ChunkedArray | pa.Array, file: str, source: str) -> pa.Array:
    text = pc.utf8_trim_whitespace(pc.replace_substring_regex(col, r"[\[\]\s,]+", " "))
    parts = pc.if_else(pc.equal(text, ""), pa.scalar([], pa.list_(pa.string())), pc.split_pattern(text, " "))
    try:
        return parts.cast(pa.list_(pa.int64()))
    except pa.ArrowInvalid as e:
        raise TraceError(f"hash_ids must be lists of integers: {str(e)[:120]}", file=file, column=source) from None


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    fmt = getattr(opts, "format", None) or ("jsonl" if src.suffix.lower() in (".jsonl", ".ndjson", ".json") else "csv")
    return (_read_jsonl if fmt == "jsonl" else _read_csv)(src, opts, meta)


def _read_csv(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    mapping, unit = parse_map(getattr(opts, "map", None), csv_header(src), opts, str(src))
    arrivals = SynthArrivals(arrival_process(opts), meta) if "arrival_ns" not in mapping else None
    ints = {s: pa.int64() for t, s in mapping.items() if t in ("input_tokens", "output_tokens", "turn", "num_images")}
    for row0, t, extra in csv_tables(src, meta, ints, list(mapping.values()), mapping.values(), map=mapping,
                                     arrival_unit=unit):
        cols = {"arrival_ns": arrivals(t.num_rows)} if arrivals else {}
        for target, source in mapping.items():
            c = t.column(source)
            if target == "arrival_ns":
                c = _arrival(c, unit, meta, str(src), source, row0)
            elif target == "hash_ids":
                c = _hash_ids(c, str(src), source)
            elif pa.types.is_string(c.type) and BY_NAME[target].nullable and target != "model":
                c = pc.if_else(pc.equal(c, ""), pa.scalar(None, pa.string()), c)  # empty cell = null
            cols[target] = c
        if extra is not None and "extra" not in mapping:
            cols["extra"] = extra
        yield pa.table(cols)


def _read_jsonl(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    mapping = unit = arrivals = None
    for row0, objs in jsonl_batches(src):
        if mapping is None:
            keys = list(dict.fromkeys(k for o in objs[:1000] for k in o))
            mapping, unit = parse_map(getattr(opts, "map", None), keys, opts, str(src))
            meta["source"].update(map=mapping, arrival_unit=unit)
            arrivals = SynthArrivals(arrival_process(opts), meta) if "arrival_ns" not in mapping else None
        cols = {"arrival_ns": arrivals(len(objs))} if arrivals else {}
        for target, source in mapping.items():
            if target == "arrival_ns":
                text = pa.array([num_text(o.get(source)) for o in objs], pa.string())
                if text.null_count:
                    raise TraceError("must not be null", file=str(src), column=source,
                                     rows=[row0 + i for i, v in enumerate(text.is_null().to_pylist()) if v])
                cols[target] = _arrival(text, unit, meta, str(src), source, row0)
            else:
                typ = BY_NAME[target].type
                typ = pa.string() if pa.types.is_dictionary(typ) else pa.int64() if pa.types.is_integer(typ) else typ
                cols[target] = column(objs, source, typ, file=str(src), row0=row0)
        extra = objs_extra(objs, set(mapping.values()))
        if "extra" not in mapping:
            cols["extra"] = extra if extra is not None else pa.nulls(len(objs), pa.string())
        elif extra is not None:  # a canonical `extra` column is taken as it is; nothing may be lost
            keys = sorted({k for o in objs for k in o if k not in mapping.values()})
            raise TraceError(f"key(s) {keys} are not trace columns and an 'extra' column exists; map (--map) or drop them",
                             file=str(src))
        yield pa.table(cols)
