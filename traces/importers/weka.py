"""Weka agentic traces (Claude Code sessions recorded by KV-cache-tester; the Hugging Face
`semianalysisai/cc-traces-weka-*` corpora) as AIPerf (`--graph-format weka_trace`) and
inference-perf (`weka_trace_replay`) read them. One JSON object per trace:

    {"id", "models", "block_size", "hash_id_scope"?: "local"|"global", "tool_tokens"?, "system_tokens"?,
     "requests": [call | subagent, ...]}
    call:     {"t": s from the trace start, "type": "n"|"s", "model", "in", "out", "hash_ids",
               "api_time"?, "think_time"?, "ttft"?, "stop"?, "input_types"?, "output_types"?}
    subagent: {"t", "type": "subagent", "agent_id", "subagent_type", "status", "duration_ms"?, ...,
               "requests": [call | subagent, ...]}

in a `.json` file, a JSON-lines corpus (one trace a line, the corpora's `traces.jsonl`) or a
directory of `.json` files. Schema: ai-dynamo/aiperf `src/aiperf/dataset/loader/weka_trace_models.py`
@ 90f31d18c57a572640729b1070a01b1bf2c7c7e4 and kubernetes-sigs/inference-perf
`inference_perf/datagen/replay/weka_trace_replay_datagen.py` @ 7de5ef2ed6f7934e0ecbc8297e593f79e68430c0.

One row per call, subagent calls included: `task_id` = trace id, `request_id` = `ID:k` (k-th
top-level call) or `ID/AGENT:k` (k-th call of subagent AGENT), `session_id` = `ID` or `ID/AGENT`,
`turn` = k (every trace starts at 0 unless `--rate R [--arrivals ...]` spaces the traces' starts as a
seeded renewal process); `in`/`out`/`hash_ids`/`model` map to input_tokens/output_tokens/hash_ids/model
(metadata block_size = the traces' `block_size`). A nested call whose `t` is before its subagent's
`t` counts from it (inference-perf's rule). Every row keeps its recorded start as arrival_ns
(each trace starts at its own 0). Dependencies are AIPerf's interval order
(`src/aiperf/dataset/graph/segment_ir/interval_order.py` @ 58028d5ba1cb33b0e135e18f1cc8833556a3639e):
a call waits for the calls that ended (`t + api_time`) by its start, less those that ended
before another such call started; calls of an `async_launched` subagent are waited for only
inside it. delay_s = start - the latest of those ends, null when that call has no `api_time`.
`local` hash ids (the default) are per trace, so they are renumbered file-wide (sorted order
per trace); `global` ids are kept. Other call keys go to `extra`, with the subagent's own keys
(`subagent.KEY`) and the trace's (`trace.KEY`) on the first call under them.
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
from .common import SynthArrivals, arrival_process, check_blocks, check_file, load_json

DOC = "Weka agentic JSON/JSONL (AIPerf, inference-perf): {id, block_size, requests: [{t, in, out, hash_ids}|subagent]}"
CALL_KEYS = {"t", "type", "model", "in", "out", "hash_ids"}
TRACE_KEYS = {"id", "block_size", "hash_id_scope", "requests"}
TYPES = {"request_id": pa.string(), "task_id": pa.string(), "session_id": pa.string(), "turn": pa.int32(),
         "model": pa.string(), "input_tokens": pa.int64(), "output_tokens": pa.int64(),
         "depends_on": pa.list_(pa.string()), "delay_s": pa.float64(), "extra": pa.string()}


def number(obj: dict, key: str, where: str, *, whole: bool = False, need: bool = True) -> Any:
    """A JSON number >= 0 (not a bool, string, NaN or absurd value); None if absent and not `need`."""
    v = obj.get(key)
    if v is None and not need:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9 or (whole and v != int(v)):
        raise TraceError(f"{where}: {key!r} must be a {'whole ' * whole}number >= 0, got {json.dumps(v)[:60]}")
    return int(v) if whole else float(v)


def _traces(src: Path) -> Iterator[tuple[str, Any]]:
    """(where, trace) from a directory of .json files, a JSON-lines corpus or one JSON document."""
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.suffix.lower() == ".json" and p.is_file())
        if not files:
            raise TraceError("no .json trace files in the directory")
        for p in files:
            yield p.name, load_json(p.read_bytes(), p.name)
        return
    check_file(src)
    with open(src, "rb") as f:
        first = f.readline()
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):  # JSON lines, one trace a line
            yield "line 1", obj
            for i, line in enumerate(f, 2):
                if line.strip():
                    yield f"line {i}", load_json(line, f"line {i}")
            return
        doc = load_json(first + f.read(), "the file")
    for i, obj in enumerate(doc if isinstance(doc, list) else [doc]):
        yield f"trace {i}", obj


def _walk(reqs: Any, tid: str, scope: str, anc: frozenset, spawn: float | None, out: list, where: str,
          pending: dict, seen: set) -> None:
    """Append the calls of `reqs` (recursing into subagents) to `out` in recorded order."""
    if not isinstance(reqs, list):
        raise TraceError(f"{where}: 'requests' must be a list")
    k = 0
    for i, r in enumerate(reqs):
        at = f"{where}, request {i}"
        if not isinstance(r, dict):
            raise TraceError(f"{at}: expected a JSON object")
        kind, t = r.get("type"), number(r, "t", at)
        if kind == "subagent":
            aid, sub = r.get("agent_id"), f"{tid}/{r.get('agent_id')}"
            if not isinstance(aid, str) or not aid or sub in seen:
                raise TraceError(f"{at}: a subagent needs an 'agent_id' string unique in its trace, got {aid!r}")
            seen.add(sub)
            own = {f"subagent.{key}": v for key, v in r.items() if key not in ("type", "requests")}
            _walk(r.get("requests"), tid, sub, anc | {sub} if r.get("status") == "async_launched" else anc, t, out,
                  f"{where}, subagent {aid}", own, seen)
            continue
        if kind not in ("n", "s"):
            raise TraceError(f"{at}: unknown request type {kind!r} (expected 'n', 's' or 'subagent')")
        if spawn is not None and t + 1e-6 < spawn:
            t += spawn
        api, ids, model = number(r, "api_time", at, need=False), r.get("hash_ids", []), r.get("model")
        try:
            ids = pa.array(ids) if isinstance(ids, list) else None
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            ids = None
        if ids is None or not (pa.types.is_integer(ids.type) or pa.types.is_null(ids.type)):
            raise TraceError(f"{at}: 'hash_ids' must be a list of integers")
        if model is not None and not isinstance(model, str):
            raise TraceError(f"{at}: 'model' must be a string")
        rest = {**{key: v for key, v in r.items() if key not in CALL_KEYS}, **(pending if k == 0 else {})}
        out.append({"request_id": f"{scope}:{k}", "session_id": scope, "turn": k, "t": t, "end": t + (api or 0.0),
                    "api": api, "anc": anc, "model": model, "hash_ids": ids.cast(pa.int64()),
                    "input_tokens": number(r, "in", at, whole=True), "output_tokens": number(r, "out", at, whole=True),
                    "extra": json.dumps(rest, ensure_ascii=False) if rest else None})
        k += 1


def _edges(calls: list[dict]) -> None:
    """Set each call's depends_on and delay_s (AIPerf's interval order, see the module doc)."""
    calls.sort(key=lambda c: (c["t"], c["end"]))  # stable: recorded order breaks ties
    st, en = np.array([c["t"] for c in calls]), np.array([c["end"] for c in calls])
    sets = list(dict.fromkeys(c["anc"] for c in calls))
    g = np.array([sets.index(c["anc"]) for c in calls])
    sub = np.array([[a <= b for b in sets] for a in sets])  # sub[x, y]: set x within set y
    for i, c in enumerate(calls):
        cand = (en[:i] <= st[i]) & sub[g[:i], g[i]]
        c["depends_on"] = c["delay_s"] = None
        if not cand.any():
            continue
        keep = np.zeros(i, bool)
        for x in np.unique(g[:i][cand]):  # c is covered by a later-ranked d it could precede
            s = np.where(cand & sub[x, g[:i]], st[:i], -np.inf)
            later = np.append(np.maximum.accumulate(s[::-1])[::-1][1:], -np.inf)
            keep |= cand & (g[:i] == x) & (later < en[:i])
        front = np.flatnonzero(keep)
        b = front[np.argmax(en[front])]
        c["depends_on"] = [calls[j]["request_id"] for j in front]
        c["delay_s"] = round(float(st[i] - en[b]), 9) if calls[b]["api"] is not None else None


SYNTH_ARRIVALS = True  # each trace starts at its own 0: --rate R spaces the traces' starts


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    meta.update(time_origin_kind="trace_start", original_time_format={"kind": "float", "unit": "s", "per": "trace"})
    proc = arrival_process(opts)
    starts = SynthArrivals(proc, meta) if proc else None
    tables, bs, scopes, base, ids = [], None, set(), 0, set()
    try:
        for n, (where, tr) in enumerate(_traces(src)):
            if opts.limit is not None and n >= opts.limit:
                break
            tid = tr.get("id") if isinstance(tr, dict) else None
            if not isinstance(tid, str) or not tid or tid in ids:
                raise TraceError(f"{where}: expected a trace object with a unique string 'id', got {tid!r}")
            ids.add(tid)
            b, scope = number(tr, "block_size", where, whole=True), tr.get("hash_id_scope", "local")
            if b < 1 or b != (bs or b):
                raise TraceError(f"{where}: block_size {b} (traces of one file must share one block_size > 0; earlier: {bs})")
            if scope not in ("local", "global") or scopes - {scope}:
                raise TraceError(f"{where}: hash_id_scope {scope!r} (expected 'local' or 'global', one per file)")
            bs, calls = b, []
            scopes.add(scope)
            _walk(tr.get("requests"), tid, tid, frozenset(), None, calls, f"{where} ({tid})",
                  {f"trace.{k}": v for k, v in tr.items() if k not in TRACE_KEYS}, {tid})
            if not calls:
                raise TraceError(f"{where}: trace {tid!r} has no calls")
            _edges(calls)
            flat = pa.concat_arrays([c["hash_ids"] for c in calls])
            if scope == "local" and len(flat):
                uniq, inv = np.unique(flat.to_numpy(), return_inverse=True)
                flat, base = pa.array(inv.astype(np.int64) + base), base + len(uniq)
            offsets = pa.array(np.cumsum([0] + [len(c["hash_ids"]) for c in calls]), pa.int32())
            t0 = starts(1)[0].as_py() if starts else 0
            cols = {"arrival_ns": pa.array(t0 + np.rint(np.array([c["t"] for c in calls]) * 1e9).astype(np.int64))}
            cols.update({k: pa.array([tid if k == "task_id" else c[k] for c in calls], t) for k, t in TYPES.items()})
            tables.append(pa.table({**cols, "hash_ids": pa.ListArray.from_arrays(offsets, flat)}))
    except TraceError as e:
        raise TraceError(e.rule, file=str(src)) if e.file is None else e from None
    except UnicodeEncodeError as e:
        raise TraceError(f"text that is not valid UTF-8 ({e.reason})", file=str(src)) from None
    if not tables:
        raise TraceError("no traces in the input", file=str(src))
    meta.update(block_size=bs)
    meta["source"].update(traces=len(ids), hash_id_scope=scopes.pop())
    table = pa.concat_tables(tables)
    order = np.argsort(table.column("arrival_ns").to_numpy(), kind="stable")
    for i in range(0, table.num_rows, 100_000):
        part = table.take(order[i:i + 100_000])
        check_blocks(part.column("hash_ids"), part.column("input_tokens"), bs, file=str(src), row0=i)
        yield part
