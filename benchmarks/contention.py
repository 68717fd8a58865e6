"""Timing under CPU contention: dispatch lag and TTFT / ITL error of `replay run` on a busy host.

    python3 benchmarks/contention.py [--duration 30] [--rate 20] [--busy 3] [--tokens 20]
                                     [--ttft 0.05] [--interval 0.02] [--nice -10] [--no-floor]

Issue 21: `replay run` used to start its runner in a new session; with scheduler autogroups on
(/proc/sys/kernel/sched_autogroup_enabled = 1) a session is a CPU group of its own, and on a busy
host that runner waited for its wake-ups. One invocation replays the same Poisson trace
(--rate req/s for --duration s) against the SSE test server (tests/replay/sse_server.py on
127.0.0.1, in a session of its own, standing for a remote target; the same in every condition):
  quiet   nothing else running;
  new     --busy pure-Python spin loops, each started in its own session (its own autogroup),
          `replay run` started from this process: its runner stays in our session (the fix);
  old     the same spinners, `replay run` started in a new session (start_new_session=True, as
          `setsid replay run`): the runner in a fresh autogroup, as before the fix; skipped, with
          the reason, when autogroups are off;
  nice    as `new` with `replay run --nice N` (runner and our autogroup at nice N; root only);
  fifo    as `new` with `replay run --realtime` (its runner under SCHED_FIFO 1; root only).
The server sends --tokens token events per request, the first --ttft s after reading it, then one
every --interval s, and logs perf_counter_ns (CLOCK_MONOTONIC on Linux) just before and after
each write (--stamp-log; --stamp-id prompt keys it by the prompt, and the trace's `prompt` is its
`request_id`). run.json `t0_monotonic` puts the records on that clock: first token = t0 +
first_token_s, token k = t0 + sent_s + token_times[k]. Printed per condition (ms): dispatch lag
(sent_s - scheduled_s) p50/p99/max; TTFT error = client first-token time - the server's write of
the first event, p50/p99/max; ITL error = the same for every later token, p50/p99 (distances
from the [before, after] write interval, 0 inside it, as accuracy.py); requests; the host's
stolen cores (mean/max over 0.1 s) and runnable tasks (mean: --busy + ~0.1 when nothing else
runs); `floor`: wake-up lateness p99/max of a bare sleeper placed as the runner (session, nice,
policy) on the same schedule, after the run: what any process there gets; ratios to `quiet`.
Target (new): lag p99 <= 2 ms and TTFT / ITL error p99 <= 2 ms with 3 spinners on 2 cores at 20
req/s. Every process it starts is ended by its PID; each run has a deadline.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import outside, read_stamps  # noqa: E402
from client_overhead import REPO, Steal, arrivals  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(REPO))
FIGS = ("lag_p50", "lag_p99", "lag_max", "ttft_p50", "ttft_p99", "ttft_max", "itl_p50", "itl_p99")


def stop(proc: subprocess.Popen) -> None:
    """End one process we started, by its PID."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def run(cmd: list[str], deadline: float, **kw) -> str:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO, **kw)
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        stop(proc)   # a SIGKILLed `replay run` takes its runner with it
        raise SystemExit(f"{cmd[2:4]} passed its deadline ({deadline:.0f} s)")
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[2:4]} failed ({proc.returncode}):\n{err[-2000:]}")
    return out


def start_server(a, log: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.replay.sse_server", "--host", "127.0.0.1", "--port", "0",
                             "--tokens", str(a.tokens), "--first-delay", str(a.ttft), "--interval", str(a.interval),
                             "--stamp-log", log, "--stamp-id", "prompt"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=REPO,
                            start_new_session=True)
    line = proc.stdout.readline() if select.select([proc.stdout], [], [], 20)[0] else ""
    if not line.startswith("sse-server ready: "):
        stop(proc)
        raise SystemExit(f"the SSE server did not start: {line!r}")
    return proc, line.split(": ", 1)[1].strip()


@contextmanager
def spinners(n: int):
    """n pure-Python busy loops, each in a session (so, with autogroups, a CPU group) of its own."""
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True))
        time.sleep(1.0)
        yield procs
    finally:
        for p in procs:
            stop(p)


@contextmanager
def runqueue():
    """Runnable tasks on the host every 0.1 s (/proc/loadavg, less this sampler): our spinners,
    runner and server, and whatever else runs on the machine (which the numbers then include)."""
    out, done = [], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            out.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        yield out
    finally:
        done.set()
        th.join()


def autogroup(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except OSError:
        return "?"


def placement(cond: str, nice: int, sleeper: bool) -> dict:
    """Popen arguments that put `replay run` (or the floor sleeper, placed as its runner) where
    the condition wants it (`nice` gives replay run --nice; the sleeper sets it itself)."""
    if cond == "old":
        return {"start_new_session": True}
    if cond == "fifo" and sleeper:
        return {"preexec_fn": lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))}
    if cond == "nice" and sleeper:   # a group (session) and a process at nice N, as the runner's
        def pre() -> None:
            Path("/proc/self/autogroup").write_text(str(nice))
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        return {"start_new_session": True, "preexec_fn": pre}
    return {}


def sleeper(times: list[float]) -> None:
    """The floor: sleep to each absolute due time (clock_nanosleep), measure how late we woke."""
    t0, late = time.monotonic() + 0.3, []
    for t in times:
        d = t0 + t - time.monotonic()
        if d > 0:
            time.sleep(d)
        late.append(time.monotonic() - t0 - t)
    ms = np.asarray(late) * 1e3
    print(json.dumps([np.percentile(ms, 99), ms.max()]))


def write_trace(path: str, times: list[float], tokens: int, prefix: str) -> None:
    from llm_replay.traces.trace import Trace
    n, rid = len(times), [f"{prefix}{i}" for i in range(len(times))]
    Trace(pa.table({"arrival_ns": (np.array(times) * 1e9).astype("int64"),
                    "input_tokens": np.full(n, 1, "int32"), "output_tokens": np.full(n, tokens, "int32"),
                    "request_id": rid, "prompt": rid})).write(path)


def measure(out: str, stamps: dict) -> dict:
    """Lag, TTFT and ITL errors of one run, its records joined to the server's stamps on request_id."""
    info = json.loads(Path(out, "run.json").read_text())
    t0 = info["t0_monotonic"]
    r = pq.read_table(Path(out, "records.parquet")).to_pydict()
    lag, ttft, itl, unmatched = [], [], [], 0
    for rid, st, sched, sent, first, tt in zip(r["request_id"], r["status"], r["scheduled_s"], r["sent_s"],
                                               r["first_token_s"], r["token_times"]):
        if sent is not None:
            lag.append(sent - sched)
        srv = stamps.get(rid, [])
        if st != "ok" or not tt or len(srv) != len(tt):
            unmatched += 1
            continue
        ttft.append(outside(t0 + first, *srv[0]))
        itl += [outside(t0 + sent + t, *srv[k]) for k, t in enumerate(tt) if k]
    res = {"n": len(r["status"]), "unmatched": unmatched, "early": sum(x < -5e-5 for x in ttft + itl),
           "group": (info.get("scheduling") or {}).get("autogroup") or "-"}
    for name, xs in (("lag", lag), ("ttft", ttft), ("itl", itl)):
        ms = np.asarray(xs) * 1e3 if xs else np.array([np.nan])
        res.update({f"{name}_p50": np.percentile(ms, 50), f"{name}_p99": np.percentile(ms, 99),
                    f"{name}_max": ms.max()})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of trace per condition")
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second (Poisson)")
    ap.add_argument("--busy", type=int, default=3, help="spinning processes, each in its own session")
    ap.add_argument("--tokens", type=int, default=20, help="token events per request")
    ap.add_argument("--ttft", type=float, default=0.05, help="server seconds to the first token")
    ap.add_argument("--interval", type=float, default=0.02, help="server seconds between tokens")
    ap.add_argument("--nice", type=int, default=-10, help="condition `nice`: replay run --nice N")
    ap.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                    help="after each run, a bare sleeper placed as the runner on the same schedule")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", metavar="DIR", help="keep the traces, run directories and stamp log in DIR")
    ap.add_argument("--sleeper", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    times = arrivals(a.rate, a.duration, a.seed)
    if a.sleeper:
        return sleeper(times)
    from llm_replay.replay.parent import autogroups_on
    groups, root = autogroups_on(), os.geteuid() == 0
    skipped = {}
    if not groups:
        skipped["old"] = (f"scheduler autogroups are {'off' if groups is False else 'unknown here'} "
                          "(/proc/sys/kernel/sched_autogroup_enabled): a new session is no CPU group of its own, "
                          "so `old` would be `new` again")
    if not root:
        skipped["nice"] = skipped["fifo"] = f"needs root (or CAP_SYS_NICE); running as uid {os.geteuid()}"
    print(f"{len(times)} requests, {a.rate:g} req/s Poisson over {a.duration:g} s, {a.tokens} tokens each: first after "
          f"{a.ttft * 1e3:g} ms, then every {a.interval * 1e3:g} ms; {os.cpu_count()} CPUs, autogroups "
          f"{'on' if groups else 'off'}, {a.busy} spinners; times in ms", flush=True)
    res, ours = {}, autogroup(os.getpid())
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        log = f"{tmp}/stamps.log"
        server, url = start_server(a, log)
        print(f"server {url} (pid {server.pid}, {autogroup(server.pid)}); this process {ours}", flush=True)
        try:
            for cond in ("quiet", "new", "old", "nice", "fifo"):
                if cond in skipped:
                    continue
                trace, out = f"{tmp}/{cond}.parquet", f"{tmp}/run-{cond}"
                write_trace(trace, times, a.tokens, f"{cond}-")
                cmd = [sys.executable, "-m", "llm_replay.replay", "run", "--trace", trace, "--target", url, "-o", out,
                       "--no-check", "--no-progress"] + (["--nice", str(a.nice)] if cond == "nice" else
                                                         ["--realtime"] if cond == "fifo" else [])
                floor = [np.nan, np.nan]
                with spinners(a.busy if cond != "quiet" else 0) as procs, Steal() as steal, runqueue() as rq:
                    print(f"{cond}: spinners (pid, autogroup) {[(p.pid, autogroup(p.pid)) for p in procs]}"
                          if procs else f"{cond}: no spinners", flush=True)
                    run(cmd, a.duration * 3 + 120, **placement(cond, a.nice, False))
                    if a.floor:
                        floor = json.loads(run([sys.executable, __file__, "--sleeper", "--rate", str(a.rate),
                                                "--duration", str(a.duration), "--seed", str(a.seed)],
                                               a.duration * 3 + 60, **placement(cond, a.nice, True)))
                res[cond] = dict(measure(out, read_stamps(log)), steal=(steal.mean, steal.max), floor=floor,
                                 runq=np.mean(rq) if rq else np.nan)
        finally:
            stop(server)
    print(f"\n{'':>5} {'runner autogroup':>18} {'n':>4} {'lag p50':>7} {'p99':>6} {'max':>6}  {'TTFTerr':>7} {'p99':>6} "
          f"{'max':>6}  {'ITLerr':>6} {'p99':>6}  {'steal':>5} {'max':>4} {'runq':>4}  {'floor p99':>9} {'max':>6}")
    for cond, r in res.items():
        group = r["group"] + (" (ours)" if r["group"] == ours else "")
        f = [f"{r[k]:{7 if k in ('lag_p50', 'ttft_p50') else 6}.3f}" for k in FIGS]
        print(f"{cond:>5} {group:>18} {r['n']:>4} {' '.join(f[:3])}  {' '.join(f[3:6])}  {' '.join(f[6:])}  "
              f"{r['steal'][0]:5.2f} {r['steal'][1]:4.1f} {r['runq']:4.1f}  {r['floor'][0]:9.3f} {r['floor'][1]:6.2f}")
        if r["unmatched"] or r["early"]:
            print(f"{'':>5}   ({r['unmatched']} requests not ok or not matched to the server's stamps, "
                  f"{r['early']} token times > 0.05 ms before the server's write)")
    if "quiet" in res:
        print("\nratio to quiet " + " ".join(f"{k:>8}" for k in FIGS))
        for cond, r in res.items():
            b = res["quiet"]
            if cond != "quiet":   # a figure of 0 on both sides reads '-'
                print(f"{cond:>14} " + " ".join(f"{r[k] / b[k]:8.1f}" if b[k] > 1e-3 else
                                               f"{'-' if r[k] <= 1e-3 else 'inf':>8}" for k in FIGS))
    for cond, why in skipped.items():
        print(f"{cond}: skipped: {why}")
    if "new" in res:
        new = res["new"]
        met = new["lag_p99"] <= 2 and new["ttft_p99"] <= 2 and new["itl_p99"] <= 2
        noise = [f"steal up to {new['steal'][1]:.1f} core"] if new["steal"][1] >= 0.15 else []
        noise += [f"{new['runq'] - a.busy:.1f} other runnable tasks on average"] if new["runq"] > a.busy + 0.5 else []
        print(f"\ntarget (new, {a.busy} spinners, {os.cpu_count()} CPUs, {a.rate:g} req/s): lag p99 <= 2 ms and "
              f"TTFT/ITL error p99 <= 2 ms: {'met' if met else 'NOT met'} (lag p99 {new['lag_p99']:.2f}, TTFT error "
              f"p99 {new['ttft_p99']:.3f}, ITL error p99 {new['itl_p99']:.3f} ms"
              + (f"; a bare sleeper there: p99 {new['floor'][0]:.2f} ms)" if a.floor else ")")
              + (f"; a noisy host: {', '.join(noise)}" if noise else ""))

if __name__ == "__main__":
    main()
