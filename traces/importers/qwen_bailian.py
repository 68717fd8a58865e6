"""Qwen / Alibaba Bailian serving traces: JSON lines with conversation trees.

Source keys: `chat_id` (-> request_id), `parent_chat_id` (-1 = a conversation root; else ->
parent_id), `timestamp` (seconds from the trace start), `input_length`, `output_length`,
`type` (request type, kept in `extra`), `turn` (kept as given), `hash_ids` (prefix blocks of
16 tokens). `session_id` is the root chat_id of each request's tree (parents are followed
across the whole file; an unknown parent starts its own session).
"""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..trace import Trace
from .common import check_blocks, json_columns, jsonl_batches
from .timeparse import ns_to_decimal
from .mooncake import write_jsonl

DOC = "Qwen-Bailian JSONL: chat_id, parent_chat_id, timestamp (s), input_length, output_length, type, turn, hash_ids"
BLOCK_SIZE = 16
LICENSE = "see alibaba/ServeGen / Qwen trace release"
FIELDS = {"input_length": ("input_tokens", pa.int64()), "output_length": ("output_tokens", pa.int64()),
          "turn": ("turn", pa.int64()), "hash_ids": ("hash_ids", pa.list_(pa.int64()))}


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    meta["source"].update(license=LICENSE)
    meta.update(block_size=BLOCK_SIZE, time_origin_kind="trace_start",
                original_time_format={"kind": "decimal", "unit": "s"})
    root: dict[str, str] = {}
    for row0, objs in jsonl_batches(src):
        cols = json_columns(objs, FIELDS, "timestamp", 10**9, file=str(src), row0=row0,
                            required=("chat_id", "input_length"), consumed=("chat_id", "parent_chat_id"))
        ids = [str(o["chat_id"]) for o in objs]
        parents = [None if o.get("parent_chat_id") in (None, -1, "-1") else str(o["parent_chat_id"]) for o in objs]
        sessions = []
        for cid, par in zip(ids, parents):
            root[cid] = root.get(par, par) if par is not None else cid
            sessions.append(root[cid])
        cols.update(request_id=pa.array(ids), parent_id=pa.array(parents, pa.string()),
                    session_id=pa.array(sessions, pa.string()))
        check_blocks(cols["hash_ids"], cols["input_tokens"], BLOCK_SIZE, file=str(src), row0=row0)
        yield pa.table(cols)


def export(trace: Trace, out: Path) -> None:
    """Qwen-Bailian JSONL (timestamps as exact decimal seconds; roots get parent_chat_id -1)."""
    t = trace.table
    if "parent_id" in t.column_names:
        t = t.set_column(t.schema.get_field_index("parent_id"), "parent_id", t.column("parent_id").fill_null("-1"))
    write_jsonl(Trace(t, trace.metadata, validate=False), out, lambda ns: ns_to_decimal(ns, 10**9),
                {"request_id": "chat_id", "parent_id": "parent_chat_id", "input_tokens": "input_length",
                 "output_tokens": "output_length", "turn": "turn", "hash_ids": "hash_ids"})
