"""What `replay run --otlp` costs the client: dispatch lag and CPU per token, with and without it.

    python3 benchmarks/otlp_overhead.py [--rate 300] [--duration 10] [--tokens 40] [--repeat 2]

One SSE test server (tests/replay/sse_server.py, pinned to the last CPU) posts a vLLM-shaped
`llm_request` span per request (`--otlp`) in every run, so the server's work is the same in both;
the same Poisson trace is replayed by `replay run` (runner pinned to CPU 0) alternately
  plain   without --otlp: the server's spans go to a receiver in this process;
  otlp    with --otlp: a traceparent header per request, the receiver in `replay run`'s parent
          (spans.parquet, every record joined).
Printed per run: dispatch lag (sent - scheduled) p50/p99/max, the runner's CPU per streamed token
(run.json client_cpu_s: the hot path), the CPU per token of the whole `replay run` process tree
(start-up and report included: the same in both, so the difference is the receiver's), and the
otlp/plain ratios of the medians. Target: no measurable change (ratios within run-to-run noise).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_overhead import REPO, Steal, arrivals, start_server, summarize  # noqa: E402


def replay(url: str, times: list[float], tokens: int, tmp: str, otlp: str | None, cpu: int | None) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from llm_replay.traces.trace import Trace
    trace, out = f"{tmp}/trace.parquet", f"{tmp}/run-{'otlp' if otlp else 'plain'}"
    n = len(times)
    Trace(pa.table({"arrival_ns": (np.array(times) * 1e9).astype("int64"), "input_tokens": np.full(n, 8, "int32"),
                    "output_tokens": np.full(n, tokens, "int32")})).write(trace)
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "llm_replay.replay", "run", "--trace", trace, "--target", url, "-o", out,
                    "--no-check", "--no-progress", "--prompt-mode", "ids", *(["--otlp", otlp] if otlp else [])],
                   check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO,
                   preexec_fn=pin, timeout=times[-1] * 10 + 120)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    info = json.loads(Path(f"{out}/run.json").read_text())
    recs = pq.read_table(f"{out}/records.parquet").to_pydict()
    sent = [x for x in recs["sent_s"] if x is not None]
    lags = [a - b for a, b in zip(recs["sent_s"], recs["scheduled_s"]) if a is not None]
    ntok = sum(len(tt or ()) for tt in recs["token_times"])
    r = summarize("otlp" if otlp else "plain", info["client_cpu_s"], 0.0, lags, ntok, recs["status"].count("ok"), n, sent)
    tree = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    r["tree_us_per_token"] = tree / max(ntok, 1) * 1e6
    if otlp:
        o = info["otlp"]
        r["joined"] = f"{o['matched']}/{o['traced']} joined, {o['missing']} missing, waited {o['waited_s']:.2f} s"
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.01, help="server seconds between tokens")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2, help="alternate plain/otlp this many times; medians")
    a = ap.parse_args()
    from llm_replay.replay.otlp import Receiver
    ncpu = os.cpu_count() or 1
    srv_cpu, cli_cpu = (ncpu - 1, 0) if ncpu > 1 else (None, None)
    sink = Receiver("127.0.0.1", 0)   # the plain runs' span sink; the otlp runs take over its port
    addr = sink.address
    proc, url = start_server(a.interval, srv_cpu, "--otlp", f"http://{addr}/v1/traces")
    times = arrivals(a.rate, a.duration, a.seed)
    print(f"server {url} (posting spans to {addr}) on cpu {srv_cpu}, runner on cpu {cli_cpu}; {len(times)} requests, "
          f"{a.rate:g}/s Poisson over {a.duration:g} s, {a.tokens} tokens {a.interval * 1e3:g} ms apart")
    print(f"{'run':>6} {'lag p50':>8} {'p99':>7} {'max':>7} ms {'runner us/tok':>14} {'tree us/tok':>12} "
          f"{'ok':>6} {'steal':>6}")
    res: dict[str, list[dict]] = {"plain": [], "otlp": []}
    try:
        for _ in range(a.repeat):
            for mode in ("plain", "otlp"):
                if mode == "otlp" and sink is not None:
                    sink.server.shutdown()
                    sink.server.server_close()
                    sink = None
                elif mode == "plain" and sink is None:
                    host, port = addr.rsplit(":", 1)
                    sink = Receiver(host, int(port))
                with tempfile.TemporaryDirectory() as tmp, Steal() as steal:
                    r = replay(url, times, a.tokens, tmp, addr if mode == "otlp" else None, cli_cpu)
                res[mode].append(r)
                print(f"{mode:>6} {r['lag_p50_ms']:8.2f} {r['lag_p99_ms']:7.2f} {r['lag_max_ms']:7.2f}    "
                      f"{r['us_per_token']:14.2f} {r['tree_us_per_token']:12.2f} {r['ok']:>6} {steal.mean:6.2f}"
                      f"  {r.get('joined', '')}", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("lag_p50_ms", "lag_p99_ms", "us_per_token",
                                                                 "tree_us_per_token")} for m, rs in res.items()}
    print(f"medians of {a.repeat}: " + "; ".join(
        f"{k} plain {med['plain'][k]:.2f} otlp {med['otlp'][k]:.2f} ratio {med['otlp'][k] / med['plain'][k]:.2f}"
        for k in med["plain"]))


if __name__ == "__main__":
    main()
