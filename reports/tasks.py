"""Agentic tasks in a run: what a task took end to end and where that time went.

A task is the rows of one `task_id`. Its time runs from its first row's schedule to its last
response's end. Its critical path is followed back from the row that ended last through, at each
step, the dependency that ended last (the one that released it); along it the time splits into
LLM calls (sent to end), tool delays (`delay_s`), waiting for dispatch (scheduled to sent) and the
rest (a root scheduled after the task's first row). Steps have a depth (0 for a root, else one
more than their deepest dependency): TTFT by depth shows what later, longer-context calls cost
(one row per depth up to 15, then one per doubling, so a deep chain's summary stays short).
Where the server reports prefix-cache hits (usage.prompt_tokens_details.cached_tokens), each
depth shows the share of its prompt tokens that hit: a task's later calls should hit on their
predecessors' prefix, and stop hitting when tool delays outlast the cache.
A task is good when every row of it is ok and its time is within `per_task.task_s`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

TASK_COLUMNS = ("request_id", "task_id", "depends_on", "delay_s")
EXACT_DEPTHS = 16   # by_depth: one row per depth below this, then one per doubling (a deep chain: ~30 rows)


@dataclass
class Tasks:
    ids: list[str]
    task_s: np.ndarray          # per task: first schedule to last end (NaN when nothing was sent)
    ok: np.ndarray              # per task: every row ok
    steps: np.ndarray           # rows per task
    path: dict[str, np.ndarray]  # per task, seconds on the critical path: llm, tool, dispatch, other
    depth: np.ndarray           # per record (-1: not in a task)
    first_row: np.ndarray       # per task: its first record (for the measured window)
    cached: np.ndarray | None = None   # per record: cached_tokens (-1: not reported)

    def good(self, limit_s: float | None) -> np.ndarray:
        return self.ok & ((self.task_s <= limit_s) if limit_s is not None else True)


def task_metrics(table: pa.Table, rm) -> Tasks | None:
    """Tasks of the records `table` (with request_id, task_id, depends_on, delay_s) whose request
    metrics are `rm`; None when no record has a task."""
    names = table.column_names
    if "task_id" not in names or "request_id" not in names or table.column("task_id").null_count == table.num_rows:
        return None
    tid, rid = (table.column(c).to_pylist() for c in ("task_id", "request_id"))
    deps = table.column("depends_on").to_pylist() if "depends_on" in names else [None] * len(rid)
    delay = (table.column("delay_s").to_numpy(zero_copy_only=False).astype(float)
             if "delay_s" in names else np.full(len(rid), np.nan))
    where = {r: i for i, (r, t) in enumerate(zip(rid, tid)) if t is not None}
    dep = [[where[d] for d in ds if d in where] if ds and t is not None else () for ds, t in zip(deps, tid)]
    depth = [-1] * len(rid)
    for i in where.values():           # records come in completion order: resolve depth on demand
        stack = [i]
        while stack:
            j = stack[-1]
            todo = [d for d in dep[j] if depth[d] < 0] if depth[j] < 0 else None
            if todo:
                stack.extend(todo)
                continue
            if depth[j] < 0:
                depth[j] = 1 + max((depth[d] for d in dep[j]), default=-1)
            stack.pop()
    # per task at once: records grouped by task (first appearance order), ends NaN-safe
    codes: dict[str, int] = {}
    at = np.array([i for i, t in enumerate(tid) if t is not None], np.int64)
    code = np.array([codes.setdefault(t, len(codes)) for t in tid if t is not None], np.int64)
    ids, n = list(codes), len(codes)
    sched, sent, end = rm.scheduled, rm.sent, rm.end
    e = end[at]
    # by task, then end, then first record first: a group's last ended last (the first such record)
    order = np.lexsort((-at, np.where(np.isnan(e), -np.inf, e), code))
    bounds = np.searchsorted(code[order], np.arange(n))
    steps = np.diff(np.append(bounds, len(order)))
    first = np.minimum.reduceat(at[order], bounds)
    ok = np.logical_and.reduceat(rm.ok[at][order], bounds)
    last = at[order][np.append(bounds[1:], len(order)) - 1]
    start = np.fmin.reduceat(sched[at][order], bounds)
    task_s = np.where(np.isnan(end[last]), np.nan, end[last] - start)
    parts = {k: np.full(n, np.nan) for k in ("llm_s", "tool_s", "dispatch_s", "other_s")}
    ends, sents, scheds, delays = end.tolist(), sent.tolist(), sched.tolist(), delay.tolist()
    for k in np.flatnonzero(~np.isnan(task_s)).tolist():
        llm = tool = disp = 0.0
        i = int(last[k])
        while True:        # back from the row that ended last, through the dependency that ended last
            llm += ends[i] - sents[i]
            disp += sents[i] - scheds[i]
            ds = [j for j in dep[i] if ends[j] == ends[j]]
            if not ds:
                break
            tool += 0.0 if delays[i] != delays[i] else delays[i]
            i = max(ds, key=ends.__getitem__)
        parts["llm_s"][k], parts["tool_s"][k], parts["dispatch_s"][k] = llm, tool, disp
    parts["other_s"] = task_s - parts["llm_s"] - parts["tool_s"] - parts["dispatch_s"]
    depth = np.array(depth, np.int32)
    cached = None
    if "cached_tokens" in names and table.column("cached_tokens").null_count < len(rid):
        cached = table.column("cached_tokens").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return Tasks(ids, task_s, ok, steps, parts, depth, first, cached)


def _dist(x: np.ndarray) -> dict | None:
    x = x[~np.isnan(x)]
    return {"n": int(len(x)), "mean": float(x.mean()), **{f"p{q}": float(np.percentile(x, q)) for q in (50, 90, 99)},
            "max": float(x.max())} if len(x) else None


def tasks_summary(tk: Tasks, rm, mask: np.ndarray, duration_s: float | None, limit_s: float | None) -> dict:
    """summary.json `tasks`: counts, task time, task goodput/attainment, the critical path's split,
    and TTFT by depth (tasks whose first record is measured)."""
    sel = mask[tk.first_row]
    good = tk.good(limit_s) & sel
    n = int(sel.sum())
    path = {k: _dist(v[sel]) for k, v in tk.path.items()}
    total = sum((p or {}).get("mean", 0.0) for p in path.values())
    ttft = rm.latency("ttft_ms")
    # prefix-cache hits the server reported (vLLM omits a 0): null counts as 0
    cached = np.maximum(tk.cached, 0) if tk.cached is not None and (tk.cached >= 0).any() else None
    by_depth = []
    d = tk.depth
    bins = np.where(d < EXACT_DEPTHS, d, EXACT_DEPTHS + np.log2(np.maximum(d, 1) / EXACT_DEPTHS).astype(np.int32))
    for b in range(int(bins.max()) + 1 if len(bins) else 0):
        at = (bins == b) & mask
        lo = b if b < EXACT_DEPTHS else EXACT_DEPTHS << (b - EXACT_DEPTHS)
        x = ttft[at & ~np.isnan(ttft)]
        ok = at & rm.ok
        prompt = float(np.nansum(rm.input_len[ok]))
        by_depth.append({"depth": lo, "to": lo if b < EXACT_DEPTHS else min(2 * lo - 1, int(d.max())),
                         "requests": int(at.sum()), "ok": int(ok.sum()),
                         **{f"ttft_ms_p{q}": float(np.percentile(x, q)) if len(x) else None for q in (50, 90)},
                         "cached_share": float(cached[ok].sum() / prompt) if cached is not None and prompt else None})
    return {"tasks": n, "completed": int((tk.ok & sel).sum()), "good": int(good.sum()), "task_s_limit": limit_s,
            "task_attainment": good.sum() / n if n else None,
            "task_goodput_per_s": good.sum() / duration_s if duration_s else None,
            "tasks_per_s": n / duration_s if duration_s else None,
            "task_s": _dist(tk.task_s[sel]), "steps": _dist(tk.steps[sel].astype(float)),
            "critical_path": {k: {**(p or {}), "share": (p["mean"] / total if p and total else None)}
                              for k, p in path.items()},
            "by_depth": by_depth}
