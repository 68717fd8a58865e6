"""Timestamp accuracy: our TTFT and inter-token gaps vs the server's own write times.

    python3 benchmarks/accuracy.py [--rate 200] [--duration 10] [--tokens 40] [--interval 0.01]

The SSE test server (pinned to the last CPU) logs `perf_counter_ns` just before and just after
writing each content event (`--stamp-log`); perf_counter is CLOCK_MONOTONIC, shared by processes
on Linux. The true write time lies between the two stamps, so errors are measured from that
interval (0 inside it).
A client process (pinned to CPU 0) replays a Poisson trace open loop and keeps each request's
token arrival times. Errors per request (our time minus the server's):
  TTFT error = first token arrival - first event write   (what our TTFT overstates it by)
  gap error  = our gap between consecutive content events - the server's gap
printed as p50/p99/max in ms, for replay.client with kernel receive timestamps (`ours`, the
default), with read-time stamps (`ours-read`), and for the aiohttp baseline (vLLM-style: a
time taken after each line is read). Target for ours: p99 <= 1 ms at 200 req/s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_overhead import REPO, arrivals, run_role, start_server  # noqa: E402

ROLES = ("aiohttp", "ours", "ours-read")   # not the floor client: its stamps are reads, not tokens


def pcts(xs: list[float]) -> str:
    xs = sorted(abs(x) * 1e3 for x in xs)
    if not xs:
        return "n=0"
    at = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]   # noqa: E731
    return f"p50 {at(0.5):7.3f}  p99 {at(0.99):7.3f}  max {xs[-1]:7.3f}  (n={len(xs)})"


def outside(x: float, lo: float, hi: float) -> float:
    """Distance of x from [lo, hi]; 0 inside."""
    return x - hi if x > hi else (x - lo if x < lo else 0.0)


def errors(client_times: dict, server: dict) -> tuple[list[float], list[float], int]:
    """The server wrote event k at some w_k in [before_k, after_k]; errors are distances from
    the intervals that bound the true write time (TTFT) and the true server gap (gaps)."""
    ttft, gaps, mismatched = [], [], 0
    for rid, ours in client_times.items():
        srv = server.get(str(rid), [])
        if not ours or len(ours) != len(srv):
            mismatched += 1
            continue
        ttft.append(outside(ours[0], *srv[0]))
        gaps += [outside(ours[k] - ours[k - 1], srv[k][0] - srv[k - 1][1], srv[k][1] - srv[k - 1][0])
                 for k in range(1, len(ours))]
    return ttft, gaps, mismatched


def read_stamps(path: str) -> dict:
    out: dict[str, list[tuple[int, float, float]]] = {}
    with open(path) as f:
        for line in f:
            rid, idx, before, after = line.split()
            if int(idx) >= 0:    # -1: when the request was read
                out.setdefault(rid, []).append((int(idx), int(before) / 1e9, int(after) / 1e9))
    return {rid: [(b, a) for _, b, a in sorted(v)] for rid, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    times = arrivals(a.rate, a.duration, a.seed)
    if a.role:   # child: replay and dump {request index: token times}
        if a.cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {a.cpu})
        record: dict = {}
        run_role(a.role, a.url, times, a.tokens, record)
        Path(a.out).write_text(json.dumps(record))
        return
    ncpu = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{a.rate:g} req/s x {a.tokens} tokens {a.interval * 1e3:g} ms apart, {a.duration:g} s; "
              f"errors = client time - server write time, absolute, ms")
        for role in ROLES:
            log = os.path.join(tmp, f"{role}.stamps")
            proc, url = start_server(a.interval, ncpu - 1 if ncpu > 1 else None, "--stamp-log", log)
            try:
                out = os.path.join(tmp, f"{role}.json")
                cmd = [sys.executable, __file__, "--role", role, "--url", url, "--out", out,
                       "--rate", str(a.rate), "--duration", str(a.duration), "--tokens", str(a.tokens),
                       "--seed", str(a.seed)]
                if ncpu > 1:
                    cmd += ["--cpu", "0"]
                subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO,
                               timeout=a.duration * 10 + 120)
            finally:
                proc.terminate()
                proc.wait(10)
            ttft, gaps, bad = errors(json.loads(Path(out).read_text()), read_stamps(log))
            print(f"{role:>9} TTFT error  {pcts(ttft)}")
            print(f"{role:>9} gap error   {pcts(gaps)}" + (f"  ({bad} requests unmatched)" if bad else ""))


if __name__ == "__main__":
    main()
