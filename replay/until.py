"""`replay run --slo S --until-decided`: replay until the gate is decided, then stop sending.

Before the run, the trace window is extended into RUN_DIR/trace.parquet up to the budget
(--max-requests rows, --max-duration of replay; default EXTRA_LAPS more passes): a generated trace
(its spec and seed in the file's metadata) draws a new realisation of its spec per pass (seed + k);
any other trace repeats its rows, with fresh request, session and parent ids and fresh prefix block
ids (`hash_ids`), so that no pass hits the prefix cache an earlier one filled (a `prompt` column's
text repeats verbatim). Each pass starts one mean gap after the previous one ended.

During the run, `Looks` reads the records as they are flushed and, when every row of the next
look's prefix (reports/sequential.py: 16, 32, 64, ... rows in trace order) has a record, gates
those rows at that look's confidence. At the first decided look (a pass of every objective, or a
failure) it asks the runner to stop: the rows not yet sent are recorded `not_sent`, and the gate
of the run judges the prefix that look judged (run.json `until_decided`). Closed sessions and task
graphs are refused: their rows' send times depend on earlier latencies, so a prefix by time would
be a sample chosen by latency.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llm_replay.reports.sequential import FIRST_LOOK, look_confidence, look_rows

EXTRA_LAPS = 7          # without a budget: the window and up to 7 more passes of it
LAP_SUFFIX = "~{}"      # request/session/parent ids of pass k (k >= 1)


class UntilError(ValueError):
    exit_code = 2


def extend_trace(args, run_dir: Path) -> dict:
    """Write RUN_DIR/trace.parquet: the window of args.trace and further passes up to the budget.
    Returns run.json's `until_decided` (the passes, their kind, the budget)."""
    from llm_replay.traces import Trace
    from llm_replay.traces.generate import generate
    src = Trace.read(args.trace)
    if args.sessions == "closed":
        raise UntilError("--until-decided with --sessions closed: a turn is sent when the previous one ended, so "
                         "the rows a look could judge would be chosen by their latency; use --sessions timestamps")
    base = _window(src.table, args)
    if "depends_on" in base.column_names and pc.any(pc.fill_null(pc.greater(
            pc.list_value_length(base.column("depends_on")), 0), False)).as_py():
        raise UntilError("--until-decided on a task-graph trace (depends_on): a dependant is sent when its "
                         "dependencies ended, so the rows a look could judge would be chosen by their latency")
    if base.num_rows == 0:
        raise UntilError("--until-decided: no trace rows in the selected window (check --start/--duration)")
    arr = base.column("arrival_ns").to_numpy()
    n, span = base.num_rows, int(arr[-1] - arr[0])
    lap_ns = span + (span // (n - 1) if n > 1 else 1_000_000_000)
    cap_rows = args.max_requests or n * (EXTRA_LAPS + 1)
    cap_ns = None if args.max_duration is None else int(args.max_duration * args.speed * 1e9)
    gen = (src.metadata.get("generator") or {})
    regenerate = bool(gen.get("spec")) and gen.get("seed") is not None
    laps, rows, k = [base], n, 1
    while rows < cap_rows and (cap_ns is None or k * lap_ns < cap_ns):
        t = _window(generate(gen["spec"], int(gen["seed"]) + k).table, args) if regenerate else base
        if t.num_rows == 0:
            break
        laps.append(_lap(t, k, int(arr[0]) + k * lap_ns, base))
        rows += t.num_rows
        k += 1
    table = pa.concat_tables(laps, promote_options="permissive").slice(0, cap_rows)
    if cap_ns is not None:
        a = table.column("arrival_ns").to_numpy()
        table = table.slice(0, max(1, int(np.searchsorted(a, a[0] + cap_ns, "right"))))
    meta = {k: v for k, v in src.metadata.items() if k != "generator"}
    Trace(table, meta, file=str(args.trace)).write(run_dir / "trace.parquet")
    return {"trace": str(args.trace), "passes": k, "pass_s": lap_ns / 1e9 / args.speed,
            "rows": table.num_rows, "how": "regenerated (seed + k)" if regenerate else "repeated (fresh ids)",
            "budget": {"max_requests": args.max_requests, "max_duration_s": args.max_duration},
            "window": {"start_s": args.start, "duration_s": args.duration}, "looks": []}


def _window(t: pa.Table, args) -> pa.Table:
    """The rows `replay run` would replay (--start/--duration), request_id filled in as the runner does."""
    if "request_id" not in t.column_names:
        t = t.append_column("request_id", pa.array(np.arange(t.num_rows).astype(str), pa.string()))
    a = t.column("arrival_ns").to_numpy()
    lo = int(a[0]) + int(args.start * 1e9) if len(a) else 0
    hi = len(a) if args.duration is None else int(np.searchsorted(a, lo + int(args.duration * 1e9)))
    return t.slice(int(np.searchsorted(a, lo)), hi - int(np.searchsorted(a, lo)))


def _lap(t: pa.Table, k: int, start_ns: int, base: pa.Table) -> pa.Table:
    """Pass k of the window: arrivals from start_ns, ids suffixed, prefix blocks renumbered."""
    a = t.column("arrival_ns").to_numpy()
    t = t.set_column(t.schema.get_field_index("arrival_ns"), "arrival_ns", pa.array(a - a[0] + start_ns))
    for name in ("request_id", "session_id", "parent_id"):
        if name in t.column_names:
            col = t.column(name).cast(pa.string())
            t = t.set_column(t.schema.get_field_index(name), name,
                             pc.binary_join_element_wise(col, pa.scalar(LAP_SUFFIX.format(k)), ""))
    if "hash_ids" in t.column_names and t.column("hash_ids").null_count < t.num_rows:
        top = pc.max(pc.list_flatten(base.column("hash_ids"))).as_py() or 0
        flat = pc.list_flatten(t.column("hash_ids"))
        off = pa.array(np.asarray(flat.to_numpy(zero_copy_only=False)) + k * (top + 1), pa.int64())
        col = t.column("hash_ids").combine_chunks()
        t = t.set_column(t.schema.get_field_index("hash_ids"), "hash_ids",
                         pa.ListArray.from_arrays(col.offsets, off, mask=col.is_null()))
    return t


class Looks:
    """The parent's watch over a run until decided: a look whenever the next prefix has records."""

    def __init__(self, run_dir: Path, slo, speed: float) -> None:
        from llm_replay.traces import Trace
        self.run_dir, self.slo = run_dir, slo
        t = Trace.read(run_dir / "trace.parquet").table
        a = t.column("arrival_ns").to_numpy()
        self.sched = (a - a[0]) / 1e9 / speed
        self.index = {rid: i for i, rid in enumerate(t.column("request_id").to_pylist())}
        self.done = np.zeros(len(a), dtype=bool)
        self.k, self.looks, self.decided = 1, [], None
        self.confidence = slo.confidence

    def bound(self, rows: int) -> tuple[int, float]:
        """The rows judged at a look of `rows` rows (ties at its edge included) and their time bound."""
        n = int(np.searchsorted(self.sched, self.sched[rows - 1], "right"))
        return n, (float(self.sched[n - 1] + self.sched[n]) / 2 if n < len(self.sched) else
                   float(self.sched[-1]) + 1.0)

    def look(self) -> bool:
        """Read the records so far; judge every look whose prefix is complete. True once decided."""
        if self.decided is not None or look_rows(self.k) > len(self.sched):
            return self.decided is not None
        from llm_replay.replay.recorder import read_stream
        stream, final = self.run_dir / "records.arrows", self.run_dir / "records.parquet"
        if stream.exists() or not final.exists():
            batches = list(read_stream(stream))
            if not batches:
                return False
            table = pa.Table.from_batches(batches)
        else:   # the run has ended (the stream became records.parquet): the looks it ended before
            import pyarrow.parquet as pq
            table = pq.read_table(final)
        idx = [self.index.get(r, -1) for r in table.column("request_id").to_pylist()]
        self.done[[i for i in idx if i >= 0]] = True
        while self.decided is None and look_rows(self.k) <= len(self.sched):
            n, until = self.bound(look_rows(self.k))
            if not self.done[:n].all():
                break
            self._judge(table, n, until)
        return self.decided is not None

    def _judge(self, table: pa.Table, n: int, until: float) -> None:
        from llm_replay.reports import evaluate_slo
        conf = look_confidence(self.confidence, self.k)
        sel = table.filter(pc.less_equal(table.column("scheduled_s"), until))
        gate = evaluate_slo(sel, self.slo, confidence=conf)
        self.looks.append({"look": self.k, "rows": n, "confidence": round(conf, 6), "exit_code": gate.exit_code,
                           "at_wall": round(time.time(), 3)})
        print(f"replay: until decided: look {self.k} at {n} rows ({conf:.2%}): "
              f"{('PASS', 'FAIL', 'undecided')[gate.exit_code]}", flush=True)
        if gate.exit_code in (0, 1):
            self.decided = {"look": self.k, "judged_rows": n, "judged_until_s": until}
        self.k += 1

    def record(self, stopped: bool) -> dict:
        """run.json `until_decided` after the run: the looks, and the one the gate is to judge (the
        decided one, else a last look over every row)."""
        info = json.loads((self.run_dir / "run.json").read_text()).get("until_decided") or {}
        last = self.decided or {"look": self.k, "judged_rows": len(self.sched),
                                "judged_until_s": float(self.sched[-1]) + 1.0}
        return {**info, "looks": self.looks, **last, "decided": self.decided is not None, "stopped": stopped,
                "confidence_per_look": round(look_confidence(self.confidence, last["look"]), 6),
                "method": f"alpha spending over looks at {FIRST_LOOK}, {2 * FIRST_LOOK}, {4 * FIRST_LOOK}, ... rows: "
                          "look k at 1 - (1 - confidence) * 6 / (pi^2 k^2)"}
