"""Agentic task graphs in a trace: `task_id`, `depends_on`, `delay_s`.

A row with `depends_on` waits for those rows (earlier rows of its own task) to complete, then
for `delay_s` (tool or think time), and is sent then: roots keep their timestamps (open loop
across tasks), dependants are released by their dependencies (closed loop inside a task).
`check_rows` holds the rules one row can break; `check_graph` the rules between rows (unknown
ids, self-dependencies, cycles, other tasks), vectorised over the whole id column.
"""
from __future__ import annotations

import graphlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import TraceError


def parse_depends_on(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A text column (CSV) as lists of ids: a JSON list `["a", "b"]` (what export writes), or
    `a;b`, `a b`, `a,b`; empty = none."""
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return col
    values = col.to_pylist()
    if any(v and v.lstrip().startswith("[") for v in values):
        out = []
        for i, v in enumerate(values):
            try:
                ids = json.loads(v) if v and v.strip() else []
            except ValueError:
                raise TraceError(f"depends_on is not a JSON list: {v[:80]!r}", column="depends_on", rows=[i]) from None
            if not (isinstance(ids, list) and all(isinstance(x, str) for x in ids)):
                raise TraceError(f"depends_on must be a list of request ids, got {v[:80]!r}", column="depends_on",
                                 rows=[i])
            out.append(ids or None)
        return pa.chunked_array([pa.array(out, pa.list_(pa.string()))])
    trimmed = pc.utf8_trim(col.cast(pa.string()), characters="[]\"' ")
    parts = pc.split_pattern_regex(trimmed, r"[\s,;\"']+")
    flat, parents = pc.list_flatten(parts), pc.list_parent_indices(parts)
    keep = pc.not_equal(flat, "")
    counts = np.bincount(pc.filter(parents, keep).to_numpy(), minlength=len(col))
    offsets = np.append(0, np.cumsum(counts)).astype(np.int32)
    empty = (counts == 0) | col.is_null().to_numpy(zero_copy_only=False)
    return pa.chunked_array([pa.ListArray.from_arrays(pa.array(offsets, mask=np.append(empty, False)),
                                                      pc.filter(flat, keep).combine_chunks()
                                                      if isinstance(flat, pa.ChunkedArray) else pc.filter(flat, keep))])


def check_rows(cols: dict[str, pa.ChunkedArray], file: str | None, n: int) -> None:
    """Rules within one row: a dependant has a task_id, delay_s is a finite >= 0 time of a dependant."""
    def check(bad: np.ndarray, column: str, rule: str) -> None:
        if np.any(bad):
            raise TraceError(rule, file=file, column=column, rows=np.flatnonzero(bad)[:11].tolist(), total_rows=n)
    deps = cols.get("depends_on")
    has = (pc.list_value_length(deps).fill_null(0).to_numpy(zero_copy_only=False) > 0
           if deps is not None else np.zeros(n, bool))
    if has.any():
        task = cols.get("task_id")
        check(has & (task.is_null().to_numpy(zero_copy_only=False) if task is not None else True), "task_id",
              "a row with depends_on needs a task_id (the task it and its dependencies belong to)")
    delay = cols.get("delay_s")
    if delay is not None and delay.null_count < n:
        v = delay.to_numpy(zero_copy_only=False).astype(np.float64)
        given = ~np.isnan(v) | ~delay.is_null().to_numpy(zero_copy_only=False)
        check(given & ~(np.nan_to_num(v, nan=-1.0, posinf=-1.0) >= 0), "delay_s",
              "delay_s must be a finite number of seconds >= 0")
        check(given & ~has, "delay_s", "delay_s is set on a row without depends_on (a root is sent at its "
              "arrival_ns; delay_s is the wait after its dependencies complete)")


def check_graph(ids: pa.ChunkedArray, tasks: pa.ChunkedArray | None, deps: pa.ChunkedArray,
                file: str | None = None, count_from: int = 0) -> np.ndarray:
    """Check the dependencies between rows (in file order) and return each row's number of
    dependants at rows >= `count_from` (a replay window's start). Every id in depends_on must be
    an earlier row's request_id of the same task."""
    n = len(ids)
    deps = deps.combine_chunks() if isinstance(deps, pa.ChunkedArray) else deps
    if n == 0 or pc.sum(pc.list_value_length(deps).fill_null(0)).as_py() in (0, None):
        return np.zeros(n, np.int32)
    flat, parent = pc.list_flatten(deps), pc.list_parent_indices(deps).to_numpy()
    pos = pc.index_in(flat, value_set=ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids)

    def error(rule: str, bad: np.ndarray) -> TraceError:  # rows: the dependants
        return TraceError(rule, file=file, column="depends_on", rows=sorted(set(parent[bad].tolist()))[:11],
                          total_rows=n)
    unknown = pos.is_null().to_numpy(zero_copy_only=False)
    if unknown.any():
        raise error(f"depends_on names an unknown request_id {flat[int(np.argmax(unknown))].as_py()!r}", unknown)
    pos = pos.to_numpy(zero_copy_only=False).astype(np.int64)
    if (pos == parent).any():
        raise error("a row depends on itself", pos == parent)
    if (pos > parent).any():
        cycle = _cycle(pos, parent, ids)
        raise error(f"depends_on forms a cycle: {' -> '.join(cycle)}" if cycle else "depends_on names a row that "
                    "comes later in the trace: a row must come after the rows it waits for (sort by arrival_ns)",
                    pos > parent)
    if tasks is not None:
        t = tasks.combine_chunks() if isinstance(tasks, pa.ChunkedArray) else tasks
        other = pc.not_equal(t.take(pa.array(pos)), t.take(pa.array(parent))).fill_null(True).to_numpy(False)
        k = int(np.argmax(other))
        if other.any():
            raise error(f"depends_on names {flat[k].as_py()!r}, a row of another task "
                        f"({t[int(pos[k])].as_py()!r}, not {t[int(parent[k])].as_py()!r})", other)
    return np.bincount(pos[parent >= count_from], minlength=n).astype(np.int32)


def _cycle(pos: np.ndarray, parent: np.ndarray, ids) -> list[str] | None:
    """A dependency cycle as ids from its earliest row, which ends it again; None without one
    (error path only)."""
    graph = graphlib.TopologicalSorter()
    for a, b in zip(parent.tolist(), pos.tolist()):
        graph.add(b, a)  # (a waits for b: its cycle lists a before b)
    try:
        graph.prepare()
    except graphlib.CycleError as e:
        loop = e.args[1][:-1]
        i = loop.index(min(loop))
        return [str(ids[j].as_py()) for j in loop[i:] + loop[:i + 1]]
    return None
