"""A deep agentic chain: the report's cost per call stays flat, and Ctrl-C ends `replay run` promptly.

    python3 benchmarks/deep_chain.py [--small 10000] [--large 100000] [--stop-calls 100000]
                                     [--stop-rows 300000] [--stop-after 10] [--grace 1] [--keep DIR]

Report: records of one task whose calls form a single chain (each depends on the previous), of
--small and of --large calls, are written as run directories and `reports.summarize_run` (summary.json,
summary.md, report.html) is timed on each in this one process; printed: ms per call of each and
their ratio (large / small; 1.0 is linear, the issue-36 code was quadratic in the depth).
Stop: a chain trace of --stop-calls calls (0.01 s tool delays) is replayed against the SSE test
server on 127.0.0.1, SIGINT comes --stop-after s after T0, and the seconds until `replay run` exits
are printed beside --grace (target: grace plus a few seconds); likewise for a plain trace of 300
rows 10 ms apart followed by --stop-rows rows an hour later (the unsent remainder). Every process it starts is ended by
its PID; each run has a deadline.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.replay.runkit import popen_run, sse_server, wait_t0, write_trace  # noqa: E402
from tests.reports.synth import synth_records, write_run  # noqa: E402

from llm_replay import reports  # noqa: E402


def chain_records(n: int) -> pa.Table:
    t = synth_records(n, rate=50.0)
    cols = {"request_id": pa.array([f"c{i}" for i in range(n)]), "task_id": pa.array(["T"] * n),
            "depends_on": pa.array([None] + [[f"c{i - 1}"] for i in range(1, n)], pa.list_(pa.string())),
            "delay_s": pa.array([None] + [0.01] * (n - 1), pa.float32())}
    for name, col in cols.items():
        t = t.set_column(t.schema.get_field_index(name), name, col.cast(t.schema.field(name).type))
    return t


def report_cost(n: int, base: Path) -> float:
    """Seconds per call of summarize_run on an n-call chain."""
    run = write_run(base / f"report{n}", chain_records(n), {"config": {}})
    t = time.perf_counter()
    reports.summarize_run(run)
    return (time.perf_counter() - t) / n


def chain_trace(n: int, base: Path) -> Path:
    ids = [f"c{i}" for i in range(n)]
    return write_trace(base / "chain.parquet", n, gap_s=0.0, output_tokens=4, request_id=ids, task_id=["T"] * n,
                       depends_on=[None] + [[x] for x in ids[:-1]], delay_s=[None] + [0.01] * (n - 1))


def remainder_trace(n: int, base: Path, head: int = 300) -> Path:
    at = np.concatenate([np.arange(head) * 0.01, 3600 + np.arange(n) * 1e-3])
    return write_trace(base / "rest.parquet", head + n, output_tokens=4, arrival_ns=(at * 1e9).astype("int64"))


def stop_time(trace: Path, after: float, grace: float, base: Path) -> tuple[float, float, int]:
    """(seconds from SIGINT to the exit of `replay run`, to its runner's end (records.parquet written,
    run.json ended_wall), its exit code) on `trace`."""
    out = base / f"stop-{trace.stem}"
    with sse_server("--interval", "0.001") as url:
        run = popen_run(trace, url, out, "--model-map", "*=m", "--grace", str(grace))
        try:
            t0 = wait_t0(out)
            time.sleep(max(0.0, t0 + after - time.time()))
            sig, sig_wall = time.monotonic(), time.time()
            run.send_signal(signal.SIGINT)
            run.communicate(timeout=600)
            ended = json.loads((out / "run.json").read_text()).get("ended_wall", float("nan"))
            return time.monotonic() - sig, ended - sig_wall, run.returncode
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait(10)
            return float("inf"), float("inf"), -9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--large", type=int, default=100_000)
    ap.add_argument("--stop-calls", type=int, default=100_000, help="0: skip the stop measurement")
    ap.add_argument("--stop-rows", type=int, default=300_000, help="0: skip the plain-trace stop measurement")
    ap.add_argument("--stop-after", type=float, default=10.0)
    ap.add_argument("--grace", type=float, default=1.0)
    ap.add_argument("--keep", help="keep the run directories here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(a.keep or tmp)
        base.mkdir(parents=True, exist_ok=True)
        report_cost(100, base)   # imports, templates: not per call
        small, large = report_cost(a.small, base), report_cost(a.large, base)
        print(f"report of a chain: {a.small:,} calls {small * 1e3:.3f} ms/call, {a.large:,} calls "
              f"{large * 1e3:.3f} ms/call, ratio {large / small:.2f} (1.0 = linear)")
        if a.stop_calls:
            took, ended, rc = stop_time(chain_trace(a.stop_calls, base), a.stop_after, a.grace, base)
            print(f"Ctrl-C on a {a.stop_calls:,}-call chain {a.stop_after:g} s after T0: replay run exited "
                  f"{took:.1f} s later, its runner ended after {ended:.1f} s (exit {rc}; --grace {a.grace:g} s)")
        if a.stop_rows:
            took, ended, rc = stop_time(remainder_trace(a.stop_rows, base), min(a.stop_after, 2.0), a.grace, base)
            print(f"Ctrl-C with {a.stop_rows:,} plain rows unsent {min(a.stop_after, 2.0):g} s after T0: replay run "
                  f"exited {took:.1f} s later, its runner ended after {ended:.1f} s (exit {rc}; --grace {a.grace:g} s)")


if __name__ == "__main__":
    main()
