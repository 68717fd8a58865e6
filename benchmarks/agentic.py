"""Memory and timing of a long agentic replay: the runner's RSS stays flat, dependants go out on time.

    python3 benchmarks/agentic.py [--calls 100000] [--hours 1] [--speed 10] [--steps 20]
                                  [--delay 2.0] [--keep DIR]

Generates an agentic trace of --calls LLM calls whose tasks start over --hours (Poisson task
starts; per task a chain of ~--steps calls, a tenth of the steps fanning out to 2-3 subagent calls
that the next step joins; tool delays log-normal with median --delay s, capped at 60 s; the context
grows 150 tokens per step) and replays it with `replay run --api chat --speed S` against the SSE
test server on 127.0.0.1 (20 tokens per call, 5 ms apart). The same rows without depends_on (every
row at its own timestamp, no graph: the runner's memory without task state) are the baseline,
replayed the same way. Printed per run: rows and records (one per row), statuses, the runner's RSS
(MiB) at 10 %, 50 % and 90 % of the run (the last 10 % holds the shutdown: records finalised) and
its max, the growth from 25 % to 90 %, dispatch lag p50/p99 (ms) of roots and of dependants; and the
ratios graph / baseline. Target: RSS growth from 25 % to 90 % <= 10 %; every row one record. The
graph run starts higher by a fixed cost: the pre-pass that checks the graph and counts each row's
dependants (pyarrow.compute's first use ~40 MB, then ~170 bytes a row while it runs). Every process it
starts is ended by its PID; each run has a deadline.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.replay.runkit import start_sse, stop  # noqa: E402

from llm_replay.traces.trace import Trace  # noqa: E402


def agentic_trace(path: Path, calls: int, hours: float, steps: float, delay: float, seed: int = 0,
                  graph: bool = True) -> int:
    rng = np.random.default_rng(seed)
    span = hours * 3600
    per_task = steps * 1.2
    n_tasks = max(1, int(calls / per_task))
    starts = np.sort(rng.uniform(0, span, n_tasks))
    rows: list[tuple] = []
    for t, t0 in enumerate(starts):
        k = int(np.clip(rng.lognormal(np.log(steps), 0.4), 3, 60))
        now, ctx, prev = t0, 500, None
        for s in range(k):
            rid = f"t{t}.{s}"
            d = float(min(60.0, rng.lognormal(np.log(delay), 1.0))) if prev else None
            now += (0.5 + (d or 0.0)) if prev else 0.0
            rows.append((int(now * 1e9), min(ctx, 7000), 20, rid, f"t{t}", prev, d))
            deps = [rid]
            if s < k - 1 and rng.random() < 0.1:          # fan out to subagents, joined by the next step
                for j in range(int(rng.integers(2, 4))):
                    sub = f"{rid}.sub{j}"
                    rows.append((int((now + 0.6) * 1e9), 300, 20, sub, f"t{t}", [rid], 0.1))
                    deps.append(sub)
                now += 1.0
            prev, ctx = deps, ctx + 150
            if len(rows) >= calls:
                break
        if len(rows) >= calls:
            break
    rows.sort(key=lambda r: r[0])
    cols = list(zip(*rows))
    table = {"arrival_ns": pa.array(cols[0], pa.int64()), "input_tokens": pa.array(cols[1], pa.int32()),
             "output_tokens": pa.array(cols[2], pa.int32()), "request_id": pa.array(cols[3])}
    if graph:
        table.update(task_id=pa.array(cols[4]), depends_on=pa.array(cols[5], pa.list_(pa.string())),
                     delay_s=pa.array(cols[6], pa.float64()))
    Trace(pa.table(table)).write(path)
    return len(rows)


def rss_mib(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def replay(trace: Path, url: str, out: Path, speed: float, deadline_s: float) -> dict:
    cmd = [sys.executable, "-m", "llm_replay.replay", "run", "--trace", str(trace), "--target", url, "-o", str(out),
           "--no-check", "--no-progress", "--api", "chat", "--speed", str(speed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, float]] = []

    def sample() -> None:
        runner = None
        while proc.poll() is None:
            if runner is None:
                runner = next((c for c in children(proc.pid) if "runner" in open(f"/proc/{c}/cmdline").read()), None)
            elif (r := rss_mib(runner)) is not None:
                samples.append((time.monotonic(), r))
            time.sleep(1.0)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        err = proc.communicate(timeout=deadline_s)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise SystemExit(f"replay of {trace.name} passed its deadline ({deadline_s:.0f} s)")
    th.join(5)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"replay exited {proc.returncode}: {err[-500:]}")
    return {"samples": samples, "records": pq.read_table(out / "records.parquet").to_pandas()}


def report(name: str, rows: int, res: dict) -> dict:
    s = res["samples"]
    t = np.array([x[0] for x in s]) - s[0][0]
    r = np.array([x[1] for x in s])
    at = lambda f: float(np.interp(f * t[-1], t, r))  # noqa: E731
    df = res["records"]
    lag = (df.sent_s - df.scheduled_s) * 1e3
    dep = df.depends_on.notna() if "depends_on" in df else np.zeros(len(df), bool)
    out = {"rows": rows, "records": len(df), "rss10": at(0.1), "rss50": at(0.5), "rss90": at(0.9),
           "max": float(r.max()), "growth": at(0.9) / at(0.25) - 1,
           "lag_roots": np.nanpercentile(lag[~dep], [50, 99]), "lag_deps": np.nanpercentile(lag[dep], [50, 99])
           if dep.any() else [np.nan, np.nan], "status": df.status.value_counts().to_dict()}
    print(f"{name:>9}: rows {rows:,} records {len(df):,} {out['status']}\n"
          f"{'':>9}  RSS MiB 10% {out['rss10']:.0f}  50% {out['rss50']:.0f}  90% {out['rss90']:.0f}  "
          f"max {out['max']:.0f}  growth 25%->90% {out['growth']:+.1%}\n"
          f"{'':>9}  lag ms roots p50/p99 {out['lag_roots'][0]:.2f}/{out['lag_roots'][1]:.2f}  "
          f"dependants p50/p99 {out['lag_deps'][0]:.2f}/{out['lag_deps'][1]:.2f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--steps", type=float, default=20.0)
    ap.add_argument("--delay", type=float, default=2.0)
    ap.add_argument("--keep", help="keep traces and run directories here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(a.keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        n = agentic_trace(d / "graph.parquet", a.calls, a.hours, a.steps, a.delay)
        agentic_trace(d / "flat.parquet", a.calls, a.hours, a.steps, a.delay, graph=False)
        print(f"trace: {n:,} calls over {a.hours} h, replayed at --speed {a.speed:g} "
              f"(~{a.hours * 3600 / a.speed / 60:.0f} min each)", flush=True)
        server = start_sse("--tokens", "20", "--interval", "0.005")
        try:
            deadline = a.hours * 3600 / a.speed * 3 + 300
            flat = report("baseline", n, replay(d / "flat.parquet", server.url, d / "flat", a.speed, deadline))
            graph = report("graph", n, replay(d / "graph.parquet", server.url, d / "graph", a.speed, deadline))
        finally:
            stop(server)
        print(f"ratios graph/baseline: max RSS {graph['max'] / flat['max']:.2f}x, RSS at 90% "
              f"{graph['rss90'] / flat['rss90']:.2f}x; graph RSS growth 25%->90% {graph['growth']:+.1%} "
              f"(target <= +10%); one record per row: {graph['records'] == n and flat['records'] == n}")


if __name__ == "__main__":
    main()
