"""Agentic task graphs in a trace: `task_id`, `depends_on`, `delay_s`.

A row with `depends_on` waits for those rows (earlier rows of its own task) to complete, then
for `delay_s` (tool or think time), and is sent then: roots keep their timestamps (open loop
across tasks), dependants are released by their dependencies (closed loop inside a task).
`check_rows` holds the rules one row can break; `check_graph` the rules between rows (unknown
ids, self-dependencies, cycles, other tasks), vectorised over the whole id column.
"""
from __future__ import annotations

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
        import json
        out = []
        for i, v in enumerate(values):
            try:
                ids = json.loads(v) if v and v.strip() else None
            except ValueError:
                ids = None
            if ids is not None and not (isinstance(ids, list) and all(isinstance(x, str) for x in ids)):
                raise TraceError(f"depends_on must be a list of request ids, got {v[:80]!r}", column="depends_on",
                                 rows=[i])
            if v and v.strip() and ids is None:
                raise TraceError(f"depends_on is not a JSON list: {v[:80]!r}", column="depends_on", rows=[i])
            out.append(ids or None)
        return pa.chunked_array([pa.array(out, pa.list_(pa.string()))])
    trimmed = pc.utf8_trim(col.cast(pa.string()), characters="[]\"' ")
    parts = pc.split_pattern_regex(trimmed, r"[\s,;\"']+")
    flat, parents = pc.list_flatten(parts), pc.list_parent_indices(parts)
    keep = pc.not_equal(flat, "")
    counts = np.bincount(pc.filter(parents, keep).to_numpy(), minlength=len(col))
    offsets = np.zeros(len(col) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    empty = (counts == 0) | col.is_null().to_numpy(zero_copy_only=False)
    return pa.chunked_array([pa.ListArray.from_arrays(pa.array(offsets, mask=np.append(empty, False)),
                                                      pc.filter(flat, keep).combine_chunks()
                                                      if isinstance(flat, pa.ChunkedArray) else pc.filter(flat, keep))])


def _rows(mask) -> list[int]:
    return np.flatnonzero(mask)[:11].tolist()


def check_rows(cols: dict[str, pa.ChunkedArray], file: str | None, n: int) -> None:
    """Rules within one row: a dependant has a task_id, delay_s is a finite >= 0 time of a dependant."""
    deps = cols.get("depends_on")
    has = (pc.list_value_length(deps).fill_null(0).to_numpy(zero_copy_only=False) > 0
           if deps is not None else np.zeros(n, bool))
    if has.any():
        task = cols.get("task_id")
        no_task = has & (task.is_null().to_numpy(zero_copy_only=False) if task is not None else True)
        if np.any(no_task):
            raise TraceError("a row with depends_on needs a task_id (the task it and its dependencies belong to)",
                             file=file, column="task_id", rows=_rows(no_task), total_rows=n)
    delay = cols.get("delay_s")
    if delay is not None and delay.null_count < n:
        v = delay.to_numpy(zero_copy_only=False).astype(np.float64)
        given = ~np.isnan(v) | ~delay.is_null().to_numpy(zero_copy_only=False)
        bad = given & ~(np.nan_to_num(v, nan=-1.0, posinf=-1.0) >= 0)
        if bad.any():
            raise TraceError("delay_s must be a finite number of seconds >= 0", file=file, column="delay_s",
                             rows=_rows(bad), total_rows=n)
        loose = given & ~has
        if loose.any():
            raise TraceError("delay_s is set on a row without depends_on (a root is sent at its arrival_ns; "
                             "delay_s is the wait after its dependencies complete)", file=file,
                             column="delay_s", rows=_rows(loose), total_rows=n)


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
    unknown = pos.is_null().to_numpy(zero_copy_only=False)
    if unknown.any():
        k = int(np.argmax(unknown))
        raise TraceError(f"depends_on names an unknown request_id {flat[k].as_py()!r}", file=file,
                         column="depends_on", rows=sorted(set(parent[unknown].tolist()))[:11], total_rows=n)
    pos = pos.to_numpy(zero_copy_only=False).astype(np.int64)
    own = pos == parent
    if own.any():
        raise TraceError("a row depends on itself", file=file, column="depends_on",
                         rows=sorted(set(parent[own].tolist()))[:11], total_rows=n)
    later = pos > parent
    if later.any():
        cycle = _cycle(pos, parent, ids)
        rule = (f"depends_on forms a cycle: {' -> '.join(cycle)}" if cycle else
                "depends_on names a row that comes later in the trace: a row must come after the rows it waits for "
                "(sort by arrival_ns)")
        raise TraceError(rule, file=file, column="depends_on", rows=sorted(set(parent[later].tolist()))[:11],
                         total_rows=n)
    if tasks is not None:
        t = tasks.combine_chunks() if isinstance(tasks, pa.ChunkedArray) else tasks
        other = pc.not_equal(t.take(pa.array(pos)), t.take(pa.array(parent))).fill_null(True)
        other = other.to_numpy(zero_copy_only=False)
        if other.any():
            k = int(np.argmax(other))
            raise TraceError(f"depends_on names {flat[k].as_py()!r}, a row of another task "
                             f"({t[int(pos[k])].as_py()!r}, not {t[int(parent[k])].as_py()!r})",
                             file=file, column="depends_on", rows=sorted(set(parent[other].tolist()))[:11],
                             total_rows=n)
    return np.bincount(pos[parent >= count_from], minlength=n).astype(np.int32)


def _cycle(pos: np.ndarray, parent: np.ndarray, ids) -> list[str] | None:
    """A dependency cycle as ids (first id repeated at the end), or None (error path only)."""
    edges: dict[int, list[int]] = {}
    for a, b in zip(parent.tolist(), pos.tolist()):
        edges.setdefault(a, []).append(b)
    state: dict[int, int] = {}
    for start in edges:
        stack, path = [(start, iter(edges.get(start, ())))], [start]
        if state.get(start):
            continue
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                loop = path[path.index(nxt):] + [nxt]
                return [str(ids[i].as_py()) for i in loop]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))
                path.append(nxt)
    return None
