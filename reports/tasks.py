"""Agentic tasks in a run: what a task took end to end and where that time went.

A task is the rows of one `task_id`. Its time runs from its first row's schedule to its last
response's end. Its critical path is followed back from the row that ended last through, at each
step, the dependency that ended last (the one that released it); along it the time splits into
LLM calls (sent to end), tool delays (`delay_s`), waiting for dispatch (scheduled to sent) and the
rest (a root scheduled after the task's first row). Steps have a depth (0 for a root, else one
more than their deepest dependency): TTFT by depth shows what later, longer-context calls cost.
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


def has_tasks(table: pa.Table) -> bool:
    return "task_id" in table.column_names and table.column("task_id").null_count < table.num_rows


def task_metrics(table: pa.Table, rm) -> Tasks | None:
    """Tasks of the records `table` (with request_id, task_id, depends_on, delay_s) whose request
    metrics are `rm`; None when no record has a task."""
    if not has_tasks(table) or "request_id" not in table.column_names:
        return None
    tid = table.column("task_id").to_pylist()
    rid = table.column("request_id").to_pylist()
    deps = table.column("depends_on").to_pylist() if "depends_on" in table.column_names else [None] * len(rid)
    delay = (table.column("delay_s").to_numpy(zero_copy_only=False).astype(float)
             if "delay_s" in table.column_names else np.full(len(rid), np.nan))
    where = {r: i for i, (r, t) in enumerate(zip(rid, tid)) if t is not None}
    rows: dict[str, list[int]] = {}
    for i, t in enumerate(tid):
        if t is not None:
            rows.setdefault(t, []).append(i)
    depth = np.full(len(rid), -1, np.int32)
    for i in where.values():           # records come in completion order: resolve depth on demand
        stack = [i]
        while stack:
            j = stack[-1]
            ds = [where[d] for d in deps[j] or () if d in where]
            todo = [d for d in ds if depth[d] < 0]
            if depth[j] >= 0 or not todo:
                if depth[j] < 0:
                    depth[j] = 1 + max((depth[d] for d in ds), default=-1)
                stack.pop()
            else:
                stack.extend(todo)
    sched, sent, end = rm.scheduled, rm.sent, rm.end
    ids = list(rows)
    n = len(ids)
    task_s, ok, steps, first = np.full(n, np.nan), np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64)
    parts = {k: np.full(n, np.nan) for k in ("llm_s", "tool_s", "dispatch_s", "other_s")}
    for k, t in enumerate(ids):
        m = np.asarray(rows[t])
        steps[k], first[k], ok[k] = len(m), m.min(), bool(rm.ok[m].all())
        e = end[m]
        if np.isnan(e).all():
            continue
        start, last = np.nanmin(sched[m]), m[int(np.nanargmax(e))]
        task_s[k] = np.nanmax(e) - start
        llm = tool = disp = 0.0
        i = last
        while True:
            llm += end[i] - sent[i]
            disp += sent[i] - sched[i]
            ds = [where[d] for d in deps[i] or () if d in where and not np.isnan(end[where[d]])]
            if not ds:
                break
            tool += 0.0 if np.isnan(delay[i]) else delay[i]
            i = max(ds, key=lambda j: end[j])
        parts["llm_s"][k], parts["tool_s"][k], parts["dispatch_s"][k] = llm, tool, disp
        parts["other_s"][k] = task_s[k] - llm - tool - disp
    cached = None
    if "cached_tokens" in table.column_names and table.column("cached_tokens").null_count < len(rid):
        cached = table.column("cached_tokens").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return Tasks(ids, task_s, ok, steps, parts, depth, first, cached)


def _dist(x: np.ndarray) -> dict | None:
    x = x[~np.isnan(x)]
    if not len(x):
        return None
    return {"n": int(len(x)), "mean": float(x.mean()), **{f"p{q}": float(np.percentile(x, q)) for q in (50, 90, 99)},
            "max": float(x.max())}


def tasks_summary(tk: Tasks, rm, mask: np.ndarray, duration_s: float | None, limit_s: float | None) -> dict:
    """summary.json `tasks`: counts, task time, task goodput/attainment, the critical path's split,
    and TTFT by depth (tasks whose first record is measured)."""
    sel = mask[tk.first_row]
    good = tk.good(limit_s) & sel
    n = int(sel.sum())
    path = {k: _dist(v[sel]) for k, v in tk.path.items()}
    total = sum((p or {}).get("mean", 0.0) for p in path.values())
    ttft = rm.latency("ttft_ms")
    cached = None     # prefix-cache hits the server reported (vLLM omits a 0): null counts as 0
    if tk.cached is not None and (tk.cached >= 0).any():
        cached = np.where(tk.cached >= 0, tk.cached, 0)
    by_depth = []
    for d in range(int(tk.depth.max()) + 1 if len(tk.depth) else 0):
        at = (tk.depth == d) & mask
        x = ttft[at]
        x = x[~np.isnan(x)]
        ok = at & rm.ok
        prompt = float(np.nansum(rm.input_len[ok]))
        by_depth.append({"depth": d, "requests": int(at.sum()), "ok": int(ok.sum()),
                         "ttft_ms_p50": float(np.percentile(x, 50)) if len(x) else None,
                         "ttft_ms_p90": float(np.percentile(x, 90)) if len(x) else None,
                         "cached_share": float(cached[ok].sum() / prompt) if cached is not None and prompt else None})
    return {"tasks": n, "completed": int((tk.ok & sel).sum()), "good": int(good.sum()), "task_s_limit": limit_s,
            "task_attainment": good.sum() / n if n else None,
            "task_goodput_per_s": good.sum() / duration_s if duration_s else None,
            "tasks_per_s": n / duration_s if duration_s else None,
            "task_s": _dist(tk.task_s[sel]), "steps": _dist(tk.steps[sel].astype(float)),
            "critical_path": {k: {**(p or {}), "share": (p["mean"] / total if p and total else None)}
                              for k, p in path.items()},
            "by_depth": by_depth}
