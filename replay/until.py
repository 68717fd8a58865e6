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
import pyarrow.parquet as pq

from llm_replay.reports.sequential import FIRST_LOOK, look_confidence, look_rows
from llm_replay.traces import Trace

EXTRA_LAPS = 7          # without a budget: the window and up to 7 more passes of it
LAP_SUFFIX = "~{}"      # request/session/parent ids of pass k (k >= 1)


class UntilError(ValueError):
    exit_code = 2


def extend_trace(args, run_dir: Path) -> dict:
    """Write RUN_DIR/trace.parquet: the window of args.trace and further passes up to the budget.
    Returns run.json's `until_decided` (the passes, their kind, the budget)."""
    from llm_replay.traces.generate import generate
    src = Trace.read(args.trace)
    if args.sessions == "closed":
        raise UntilError("--until-decided with --sessions closed: a turn waits for the previous one, so a look "
                         "would judge rows chosen by their latency; use --sessions timestamps")
    base = _window(src.table, args)
    if "depends_on" in base.column_names and (pc.max(pc.list_value_length(base.column("depends_on"))).as_py() or 0):
        raise UntilError("--until-decided on a task-graph trace (depends_on): looks would judge rows chosen by latency")
    if base.num_rows == 0:
        raise UntilError("--until-decided: no trace rows in the selected window (check --start/--duration)")
    arr = base.column("arrival_ns").to_numpy()
    n, span = base.num_rows, int(arr[-1] - arr[0])
    lap_ns = span + (span // (n - 1) if n > 1 else 1_000_000_000)
    cap_rows = args.max_requests or n * (EXTRA_LAPS + 1)
    cap_ns = None if args.max_duration is None else int(args.max_duration * args.speed * 1e9)
    gen = (src.metadata.get("generator") or {})
    regenerate = bool(gen.get("spec")) and gen.get("seed") is not None
    laps = [base]
    while sum(x.num_rows for x in laps) < cap_rows and (cap_ns is None or len(laps) * lap_ns < cap_ns):
        k = len(laps)
        t = _window(generate(gen["spec"], int(gen["seed"]) + k).table, args) if regenerate else base
        if t.num_rows == 0:
            break
        laps.append(_lap(t, k, int(arr[0]) + k * lap_ns, base))
    table = pa.concat_tables(laps, promote_options="permissive").slice(0, cap_rows)
    if cap_ns is not None:
        a = table.column("arrival_ns").to_numpy()
        table = table.slice(0, max(1, int(np.searchsorted(a, a[0] + cap_ns, "right"))))
    meta = {k: v for k, v in src.metadata.items() if k != "generator"}
    Trace(table, meta, file=str(args.trace)).write(run_dir / "trace.parquet")
    return {"trace": str(args.trace), "passes": len(laps), "pass_s": lap_ns / 1e9 / args.speed,
            "rows": table.num_rows, "how": "regenerated (seed + k)" if regenerate else "repeated (fresh ids)",
            "budget": {"max_requests": args.max_requests, "max_duration_s": args.max_duration},
            "window": {"start_s": args.start, "duration_s": args.duration}, "looks": []}


def _window(t: pa.Table, args) -> pa.Table:
    """The rows `replay run` would replay (--start/--duration), request_id filled in as the runner does."""
    if "request_id" not in t.column_names:
        t = t.append_column("request_id", pa.array(np.arange(t.num_rows).astype(str), pa.string()))
    a = t.column("arrival_ns").to_numpy()
    lo = int(a[0]) + int(args.start * 1e9) if len(a) else 0
    i = int(np.searchsorted(a, lo))
    return t.slice(i, None if args.duration is None else int(np.searchsorted(a, lo + int(args.duration * 1e9))) - i)


def _lap(t: pa.Table, k: int, start_ns: int, base: pa.Table) -> pa.Table:
    """Pass k of the window: arrivals from start_ns, ids suffixed, prefix blocks renumbered."""
    a = t.column("arrival_ns").to_numpy()
    new = {"arrival_ns": pa.array(a - a[0] + start_ns)}
    for name in {"request_id", "session_id", "parent_id"} & set(t.column_names):
        new[name] = pc.binary_join_element_wise(t.column(name).cast(pa.string()), LAP_SUFFIX.format(k), "")
    if "hash_ids" in t.column_names and t.column("hash_ids").null_count < t.num_rows:
        top = pc.max(pc.list_flatten(base.column("hash_ids"))).as_py() or 0
        col = t.column("hash_ids").combine_chunks()
        off = pc.add(pc.list_flatten(col).cast(pa.int64()), k * (top + 1))
        new["hash_ids"] = pa.ListArray.from_arrays(col.offsets, off, mask=col.is_null())
    for name, col in new.items():
        t = t.set_column(t.schema.get_field_index(name), name, col)
    return t


class Looks:
    """The parent's watch over a run until decided: a look whenever the next prefix has records."""

    def __init__(self, run_dir: Path, slo, speed: float) -> None:
        self.run_dir, self.slo = run_dir, slo
        t = Trace.read(run_dir / "trace.parquet").table
        a = t.column("arrival_ns").to_numpy()
        self.sched = (a - a[0]) / 1e9 / speed
        self.index = {rid: i for i, rid in enumerate(t.column("request_id").to_pylist())}
        self.done = np.zeros(len(a), dtype=bool)
        self.k, self.looks, self.decided = 1, [], None

    def look(self) -> bool:
        """Read the records so far; judge every look whose prefix is complete. True once decided."""
        if self.decided is not None or look_rows(self.k) > len(self.sched):
            return self.decided is not None
        from llm_replay.replay.recorder import read_stream
        stream, final = self.run_dir / "records.arrows", self.run_dir / "records.parquet"
        if final.exists() and not stream.exists():   # the run has ended: the looks it ended before
            table = pq.read_table(final)
        elif batches := list(read_stream(stream)):
            table = pa.Table.from_batches(batches)
        else:
            return False
        idx = [self.index.get(r, -1) for r in table.column("request_id").to_pylist()]
        self.done[[i for i in idx if i >= 0]] = True
        while self.decided is None and look_rows(self.k) <= len(self.sched):
            # the rows of this look (ties at its edge included), and their time bound
            n = int(np.searchsorted(self.sched, self.sched[look_rows(self.k) - 1], "right"))
            if not self.done[:n].all():
                break
            self._judge(table, n, float((self.sched[n - 1] + self.sched[n]) / 2 if n < len(self.sched) else
                                        self.sched[-1] + 1.0))
        return self.decided is not None

    def _judge(self, table: pa.Table, n: int, until: float) -> None:
        from llm_replay.reports import evaluate_slo
        conf = look_confidence(self.slo.confidence, self.k)
        gate = evaluate_slo(table.filter(pc.less_equal(table.column("scheduled_s"), until)), self.slo, confidence=conf)
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
                "confidence_per_look": round(look_confidence(self.slo.confidence, last["look"]), 6),
                "method": f"alpha spending over looks at {FIRST_LOOK}, {2 * FIRST_LOOK}, {4 * FIRST_LOOK}, ... rows: "
                          "look k at 1 - (1 - confidence) * 6 / (pi^2 k^2)"}
