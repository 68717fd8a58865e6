"""Peak memory of `replay run` on a huge trace: bounded by what is in flight, not by the trace.

One run: writes a trace of --rows rows (default 10M, 1 ms apart) and a small trace with
just --requests rows, starts the fast SSE test server, and replays the same --requests-row
window of each at --rate req/s. Prints the runner's peak RSS for both and their ratio
(target: the 10M-row trace stays <= 1 GB and close to the small one), plus the achieved
rate and dispatch lag, and checks that every replayed row has its record.

    python3 benchmarks/long_trace.py                 # 10M-row trace, 20k requests at 1000 req/s
    python3 benchmarks/long_trace.py --rows 1000000 --requests 5000
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tests.replay.runkit import popen_run, records, start_sse, stop  # noqa: E402
from llm_replay.traces.schema import schema_for  # noqa: E402


def write_big(path: Path, rows: int, gap_ns: int = 1_000_000) -> None:
    """A canonical trace written in row groups (never the whole table in memory)."""
    schema = schema_for(["arrival_ns", "input_tokens", "output_tokens"])
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        for lo in range(0, rows, 1 << 20):
            n = min(1 << 20, rows - lo)
            w.write_table(pa.table({"arrival_ns": pa.array(np.arange(lo, lo + n, dtype=np.int64) * gap_ns),
                                    "input_tokens": pa.array(np.full(n, 64, np.int32)),
                                    "output_tokens": pa.array(np.full(n, 16, np.int32))}, schema=schema))


def replay_peak(trace: Path, url: str, out: Path, requests: int, speed: float) -> tuple[float, float]:
    """(peak RSS of the `replay run` process tree in MB, wall seconds)."""
    t = time.time()
    run = popen_run(trace, url, out, "--model-map", "*=m", "--max-requests", str(requests),
                    "--speed", str(speed), "--timeout", "30")
    peak = [0.0]

    def sample():
        proc = psutil.Process(run.pid)
        while run.poll() is None:
            try:
                tree = [proc, *proc.children(recursive=True)]  # `replay run` + its runner
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree) / 2**20)
            except psutil.Error:
                pass
            time.sleep(0.05)
    th = threading.Thread(target=sample)
    th.start()
    _, err = run.communicate()
    th.join()
    if run.returncode != 0:
        raise SystemExit(f"replay run failed:\n{err[-3000:]}")
    return peak[0], time.time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows in the big trace")
    ap.add_argument("--requests", type=int, default=20_000, help="rows replayed from each trace")
    ap.add_argument("--rate", type=float, default=1000.0, help="replay rate, req/s")
    args = ap.parse_args()
    speed = args.rate / 1000.0  # rows are 1 ms apart
    with tempfile.TemporaryDirectory(prefix="long-trace-") as d:
        d = Path(d)
        t = time.time()
        write_big(d / "big.parquet", args.rows)
        write_big(d / "small.parquet", args.requests)
        print(f"traces: {args.rows:,} rows ({(d / 'big.parquet').stat().st_size / 2**20:.0f} MB) and "
              f"{args.requests:,} rows, written in {time.time() - t:.1f}s")
        srv = start_sse("--interval", "0.002")
        try:
            res = {}
            for name in ("small", "big"):
                peak, wall = replay_peak(d / f"{name}.parquet", srv.url, d / f"run-{name}", args.requests, speed)
                df = records(d / f"run-{name}")
                assert len(df) == args.requests, (name, len(df))
                lag = (df.sent_s - df.scheduled_s).dropna().to_numpy() * 1e3
                span = df.sent_s.max() - df.sent_s.min()
                res[name] = peak
                print(f"{name:5s} trace: peak RSS {peak:7.1f} MB  wall {wall:5.1f}s  ok {int((df.status == 'ok').sum()):,}"
                      f"/{len(df):,}  achieved {len(df) / span:6.0f} req/s  lag p50/p99/max "
                      f"{np.percentile(lag, 50):.2f}/{np.percentile(lag, 99):.2f}/{lag.max():.2f} ms")
        finally:
            stop(srv)
    ratio = res["big"] / res["small"]
    verdict = "PASS" if res["big"] <= 1024 else "FAIL"
    print(f"peak RSS big/small = {ratio:.2f}x; big trace peak {res['big']:.0f} MB <= 1024 MB: {verdict}")


if __name__ == "__main__":
    main()
