"""The tool's own ceiling: the load `replay run` can deliver from one core to a zero-work server.

    python3 benchmarks/roofline.py [--rates 250,500,1000,2000,3000] [--duration 5] [--tokens 40]

One run starts the SSE test server (tests/replay/sse_server.py, --interval 0: every token at once,
no work) pinned to the last CPU and, for each rate, `replay run` (one runner process, pinned to
CPU 0) on a Poisson trace of that rate, `--tokens` tokens a request. Per rate it prints the rate
achieved (requests / span of their sends), the send error (lag = sent - scheduled) p50/p99/max,
the client's CPU (run.json `client_cpu_s`: the runner from T0 to its last record) per 1k streamed
tokens and per request, the cores it used (that CPU over T0 to the last token stamp), the requests
a core could carry at that CPU per request (the roofline: 1 / CPU per request), the host's stolen cores, and the stimulus certificate's verdict
(summary.json `stimulus`, reports/certificate.py). Goal: >= 2000 req/s of 40-token streams on one
core at lag p99 <= 5 ms (the rate achieved within 5 % of the offered one).

Peers, side by side where installed: an asyncio + aiohttp open-loop client (the loop of vLLM's
`benchmark_serving`, benchmarks/client_overhead.py) on the same CPU and trace; `vllm bench serve`,
`guidellm` and `aiperf` are looked for and, as each needs a model's tokenizer or its own server
protocol checks that this zero-work server does not answer offline, reported as found or not and
skipped with the reason.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_overhead import REPO, Steal, arrivals, client as baseline, start_server  # noqa: E402

GOAL_RATE, GOAL_LAG_MS = 2000.0, 5.0
PEERS = {"vllm": "vllm", "guidellm": "guidellm", "aiperf": "aiperf"}   # name: module


def replay(url: str, times: list[float], tokens: int, cpu: int | None, tmp: str, extra: list[str]) -> dict | None:
    """One `replay run` of these arrival times, pinned to `cpu`; its figures and certificate (None,
    with the reason printed, when it sent nothing)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from llm_replay.traces.trace import Trace
    trace, out = f"{tmp}/trace.parquet", f"{tmp}/run"
    n = len(times)
    Trace(pa.table({"arrival_ns": (np.array(times) * 1e9).astype("int64"), "input_tokens": np.full(n, 8, "int32"),
                    "output_tokens": np.full(n, tokens, "int32")})).write(trace)
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    p = subprocess.run([sys.executable, "-m", "llm_replay.replay", "run", "--trace", trace, "--target", url, "-o", out,
                        "--no-check", "--no-progress", "--prompt-mode", "ids", *extra], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, preexec_fn=pin, timeout=times[-1] * 20 + 180)
    if not Path(f"{out}/summary.json").exists():
        raise SystemExit(f"replay run exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    info = json.loads(Path(f"{out}/run.json").read_text())
    stim = json.loads(Path(f"{out}/summary.json").read_text())["stimulus"]
    rec = pq.read_table(f"{out}/records.parquet", columns=["sent_s", "scheduled_s", "last_token_s", "status",
                                                         "token_times"])
    sent, sched = (rec.column(c).to_numpy(zero_copy_only=False).astype(float) for c in ("sent_s", "scheduled_s"))
    went = ~np.isnan(sent)
    if went.sum() < 2:
        print(f"replay run sent nothing (exit {p.returncode}): {p.stdout[-600:]}", flush=True)
        return None
    lag = np.sort((sent[went] - sched[went]) * 1e3)
    ntok = int(sum(len(t or ()) for t in rec.column("token_times").to_pylist()))
    ok = rec.column("status").to_pylist().count("ok")
    span = float(sent[went].max() - sent[went].min())
    last = rec.column("last_token_s").to_numpy(zero_copy_only=False).astype(float)
    wall = float(np.nanmax(np.fmax(last, sent)) - np.nanmin(sched))     # T0 to the last stamp
    cpu_s = float(info["client_cpu_s"])
    return {"rate": went.sum() / span, "lag_p50_ms": float(np.percentile(lag, 50)),
            "lag_p99_ms": float(np.percentile(lag, 99)), "lag_max_ms": float(lag[-1]), "ok": ok, "n": n,
            "tokens": ntok, "cpu_s": cpu_s, "cpu_s_per_1k_tokens": cpu_s / max(ntok, 1) * 1e3,
            "cpu_us_per_request": cpu_s / n * 1e6, "cores": cpu_s / wall, "delivered": stim["delivered"],
            "reasons": stim["reasons"]}


def peers() -> list[str]:
    """Why each peer is skipped (found or not)."""
    out = []
    for name, module in PEERS.items():
        found = shutil.which(name) or importlib.util.find_spec(module) is not None
        out.append(f"{name}: skipped: " + ("installed, but it needs a model's tokenizer (a download) to shape its "
                                           "requests; not driven here" if found else "not installed"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="250,500,1000,2000,3000")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="runs per rate; medians")
    ap.add_argument("--realtime", action="store_true", help="`replay run --realtime` (SCHED_FIFO; root or "
                    "CAP_SYS_NICE): the runner wakes at once on a busy host")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                    help="also the asyncio + aiohttp open-loop client at each rate")
    a = ap.parse_args()
    ncpu = os.cpu_count() or 1
    srv_cpu, cli_cpu = (ncpu - 1, 0) if ncpu > 1 and hasattr(os, "sched_setaffinity") else (None, None)
    proc, url = start_server(0.0, srv_cpu)
    print(f"zero-work SSE server {url} on cpu {srv_cpu}; `replay run` (1 runner{', --realtime' if a.realtime else ''}) "
          f"on cpu {cli_cpu}; {a.tokens} "
          f"tokens a request; {a.duration:g} s Poisson traces; medians of {a.repeat}")
    print(f"{'offered':>8} {'client':>8} {'req/s':>8} {'lag p50':>8} {'p99':>7} {'max':>8} ms {'CPU s/1k tok':>12} "
          f"{'us/req':>7} {'cores':>5} {'req/s/core':>10} {'steal':>5} {'delivered':>9}")
    goal = None
    try:
        for rate in map(float, a.rates.split(",")):
            times = arrivals(rate, a.duration, a.seed)
            runs = []
            for _ in range(a.repeat):
                with tempfile.TemporaryDirectory() as tmp, Steal() as steal:
                    r = replay(url, times, a.tokens, cli_cpu, tmp, ["--realtime"] if a.realtime else [])
                if r is not None:
                    runs.append(dict(r, steal_max=steal.max))
            if not runs:
                continue
            med = {k: statistics.median(x[k] for x in runs) for k in
                   ("rate", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "cpu_s_per_1k_tokens", "cpu_us_per_request",
                    "cores", "steal_max")}
            delivered = "/".join(str(x["delivered"]).lower() for x in runs)
            print(f"{rate:8g} {'replay':>8} {med['rate']:8.1f} {med['lag_p50_ms']:8.2f} {med['lag_p99_ms']:7.2f} "
                  f"{med['lag_max_ms']:8.1f}    {med['cpu_s_per_1k_tokens']:12.3f} {med['cpu_us_per_request']:7.0f} "
                  f"{med['cores']:5.2f} {1e6 / med['cpu_us_per_request']:10.0f} {med['steal_max']:5.2f} "
                  f"{delivered:>9}", flush=True)
            for x in runs:
                if x["reasons"]:
                    print(f"{'':>17} not delivered: {'; '.join(x['reasons'])}", flush=True)
            if rate == GOAL_RATE:
                goal = med
            if a.baseline and importlib.util.find_spec("aiohttp") is not None:
                b = baseline("aiohttp", url, rate, a.duration, a.tokens, a.seed, cli_cpu)
                cpu_s = b["us_per_token"] * b["tokens"] / 1e6
                print(f"{rate:8g} {'aiohttp':>8} {b['rate']:8.1f} {b['lag_p50_ms']:8.2f} {b['lag_p99_ms']:7.2f} "
                      f"{b['lag_max_ms']:8.1f}    {b['us_per_token'] / 1e3:12.3f} {cpu_s / b['n'] * 1e6:7.0f} "
                      f"{'':>5} {b['n'] / cpu_s:10.0f} {b['steal_max']:5.2f} {'':>9}", flush=True)
        for line in peers():
            print(line)
        if goal is not None:
            met = goal["rate"] >= 0.95 * GOAL_RATE and goal["lag_p99_ms"] <= GOAL_LAG_MS
            print(f"goal {GOAL_RATE:g} req/s x {a.tokens} tokens on one core at lag p99 <= {GOAL_LAG_MS:g} ms: "
                  f"{'met' if met else 'NOT met'} (sent {goal['rate']:.0f} req/s, lag p99 {goal['lag_p99_ms']:.2f} ms;"
                  f" one core's roofline at this CPU per request: {1e6 / goal['cpu_us_per_request']:.0f} req/s)")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
