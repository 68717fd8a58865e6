"""AIBrix workload files: JSON lines of request groups sharing a timestamp.

`{"timestamp": ms, "requests": [{"prompt", "prompt_length", "output_length", "session_id"?}]}`;
the older capitalised keys (`Timestamp`, `Requests`, `Prompt`, `Prompt Length`, `Output Length`)
are accepted too (keys are matched case-insensitively, spaces as underscores). Each request
becomes a row at its group's time; other request keys, and other group keys (as `group.KEY`),
go to `extra`.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import TraceError
from ..trace import Trace
from .common import export_source, json_columns, jsonl_batches
from .mooncake import postprocess  # noqa: F401 - --dequantize applies to AIBrix groups too

DOC = "AIBrix JSONL: {timestamp (ms), requests: [{prompt, prompt_length, output_length, session_id}]}"
FIELDS = {"prompt": ("prompt", pa.string()), "prompt_length": ("input_tokens", pa.int64()),
          "output_length": ("output_tokens", pa.int64()), "session_id": ("session_id", pa.string())}


def _norm(d: dict) -> dict:
    return {k.strip().lower().replace(" ", "_"): v for k, v in d.items()}


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    meta.update(time_origin_kind="trace_start", original_time_format={"kind": "decimal", "unit": "ms"})
    capitalised = None
    for row0, groups in jsonl_batches(src, batch_rows=5000):
        rows = []
        for i, g in enumerate(groups):
            capitalised = capitalised if capitalised is not None else "Timestamp" in g
            g = _norm(g)
            reqs = g.pop("requests", None)
            if not isinstance(reqs, list) or "timestamp" not in g:
                raise TraceError(f"line {row0 + i + 1}: a group needs 'timestamp' and a 'requests' list", file=str(src))
            ts = g.pop("timestamp")
            for r in reqs:
                if not isinstance(r, dict):
                    raise TraceError(f"line {row0 + i + 1}: each request must be a JSON object", file=str(src))
                r = _norm(r)
                if r.get("session_id") is not None:
                    r["session_id"] = str(r["session_id"])
                rows.append({**{f"group.{k}": v for k, v in g.items()}, **r, "timestamp": ts})
        if rows:
            yield pa.table(json_columns(rows, FIELDS, "timestamp", 10**6, file=str(src), row0=row0,
                                        required=("prompt_length",)))
    meta["source"]["capitalised_keys"] = bool(capitalised)


def export(trace: Trace, out: Path) -> None:
    """AIBrix JSONL: consecutive requests with the same arrival form one group."""
    t, (src, ns) = trace.table, export_source(trace, "aibrix")
    key = (lambda k: k.replace("_", " ").title().replace("Id", "ID")) if src.get("capitalised_keys") else (lambda k: k)
    ms = ns // 10**6
    cols = {k: t.column(name).to_pylist() for k, (name, _) in FIELDS.items() if name in t.column_names}
    extras = t.column("extra").to_pylist() if "extra" in t.column_names else [None] * t.num_rows
    starts = np.flatnonzero(np.concatenate([[True], np.diff(ms) != 0])).tolist() + [t.num_rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for a, b in zip(starts[:-1], starts[1:]):
            group: dict[str, Any] = {key("timestamp"): int(ms[a])}
            reqs = []
            for i in range(a, b):
                r = {key(k): int(v[i]) if k == "session_id" and v[i].isdigit() else v[i]
                     for k, v in cols.items() if v[i] is not None}
                for k, v in (json.loads(extras[i]) if extras[i] else {}).items():
                    if k.startswith("group."):
                        group[k[6:]] = v
                    else:
                        r[k] = v
                reqs.append(r)
            group[key("requests")] = reqs
            f.write(json.dumps(group, ensure_ascii=False) + "\n")
