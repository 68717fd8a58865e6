"""SGLang agentic traces (`bench_serving --dataset-name agentic-trace`, also what its `agentic`
dataset caches): one JSON document

    {"metadata": {...}, "conversations": [[{"messages": [...], "prompt_tokens": N, "output_tokens"?: M}, ...], ...]}

Schema: sgl-project/sglang `python/sglang/benchmark/datasets/agentic_trace.py` @
968d788775052c91318d2fc40f9dc0fda218c6c1 (the loader) and `python/sglang/test/agentic_trace_utils.py`
@ 1d7f9d7c196b65102cb6c73a9e0e7a595bedbb50 (the per-turn `output_tokens`, written from Weka traces).
A turn's `messages` are only the messages it adds; SGLang sends them after the history and the
server's own earlier replies, so `prompt_tokens` (input_tokens) is the whole prompt.

One conversation is one task, a chain: turn k (`request_id` `C:k`, `task_id` = `session_id` = C,
the conversation's index) depends on turn k-1. Turns without messages are skipped, as SGLang
does. output_tokens = `output_tokens` where recorded, else null (SGLang then asks for 220).
The format has no times and no tool/think time: delay_s stays null and every row's arrival is
its conversation's start, 0 for all, or with `--rate R [--arrivals ...]` a seeded renewal
process of conversation starts at R per second. Other turn keys (`messages`) go to `extra`;
the file's `metadata` to the trace metadata (`source.metadata`). The file is read whole, as
SGLang reads it.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import TraceError
from .common import SynthArrivals, arrival_process, check_file, load_json
from .weka import number

DOC = "SGLang agentic-trace JSON: {metadata, conversations: [[{messages, prompt_tokens, output_tokens?}]]}"
SYNTH_ARRIVALS = True  # no times in the source: conversations start at 0, or at --rate R per second
TYPES = {"arrival_ns": pa.int64(), "request_id": pa.string(), "task_id": pa.string(), "session_id": pa.string(),
         "turn": pa.int32(), "depends_on": pa.list_(pa.string()), "input_tokens": pa.int64(),
         "output_tokens": pa.int64(), "extra": pa.string()}


def _table(rows: list[dict], src: Path) -> pa.Table:
    try:
        return pa.table({k: pa.array([r[k] for r in rows], t) for k, t in TYPES.items()})
    except UnicodeEncodeError as e:
        raise TraceError(f"text that is not valid UTF-8 ({e.reason})", file=str(src)) from None


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    check_file(src)
    doc = load_json(src.read_bytes(), file=str(src))
    convs = doc.get("conversations") if isinstance(doc, dict) else None
    if not isinstance(convs, list) or not convs:
        raise TraceError("expected a JSON object with a non-empty 'conversations' list", file=str(src))
    proc = arrival_process(opts)
    starts = SynthArrivals(proc, meta) if proc else None
    if starts is None:
        meta.update(time_origin_kind="none", original_time_format={"kind": "none"})
    if isinstance(doc.get("metadata"), dict):
        meta["source"]["metadata"] = doc["metadata"]
    rows, done = [], 0
    for c, conv in enumerate(convs):
        if opts.limit is not None and c >= opts.limit:
            break
        done = c + 1
        if not isinstance(conv, list):
            raise TraceError(f"conversation {c}: expected a list of turns", file=str(src))
        start, k = starts(1)[0].as_py() if starts else 0, 0
        for j, turn in enumerate(conv):
            if not isinstance(turn, dict):
                raise TraceError(f"conversation {c}, turn {j}: expected a JSON object", file=str(src))
            if not turn.get("messages"):
                continue
            try:
                lengths = [number(turn, key, f"conversation {c}, turn {j}", whole=True, need=key == "prompt_tokens")
                           for key in ("prompt_tokens", "output_tokens")]
            except TraceError as e:
                raise TraceError(e.rule, file=str(src)) from None
            rest = {key: v for key, v in turn.items() if key not in ("prompt_tokens", "output_tokens")}
            rows.append({"arrival_ns": start, "request_id": f"{c}:{k}", "task_id": str(c), "session_id": str(c),
                         "turn": k, "depends_on": [f"{c}:{k - 1}"] if k else None, "input_tokens": lengths[0],
                         "output_tokens": lengths[1], "extra": json.dumps(rest, ensure_ascii=False)})
            k += 1
        if len(rows) >= 20_000:
            yield _table(rows, src)
            rows = []
    if rows:
        yield _table(rows, src)
    meta["source"]["conversations"] = done
