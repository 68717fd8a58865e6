"""Token receive times of `replay run` against a packet capture, quiet and on a busy host.

    python3 benchmarks/stamps_pcap.py [--duration 20] [--rate 10] [--tokens 30] [--interval 0.02]
                                      [--busy 3] [--spin-here] [--realtime] [--keep DIR]

Issue 36 item 12: with kernel receive stamps (SO_TIMESTAMPNS), a read that comes late takes the
events queued meanwhile at once, and TCP hands back one stamp per read (the last segment's), so
those events share a time: recorded gaps of exactly 0 that the wire does not show, a late TTFT.
Per condition (quiet; `--busy` pure-Python spinners, each in a session of its own, or with
`--spin-here` in ours, so in the runner's CPU group, which gives it late wake-ups; with
`--realtime`, also the busy host with `replay run --realtime`) it starts the SSE test server
(tests/replay/sse_server.py, one write per event), `tcpdump -i lo` on the server's port, and
`replay run` of the same Poisson trace (request_id = prompt, which the capture reads back from
each POST body), then compares every ok record's token times with the capture's packet times of
its events (loopback retransmissions dropped, as ../shared/realserver/pcap_truth.py does).
Printed (ms): requests matched; zero gaps: the share of recorded gaps that are exactly 0 where
the wire's gap is > 0.1 ms; TTFT error (record - wire) p50 / p99 / max; token error (every
token event) p99 / max; the host's runnable tasks; packets tcpdump dropped.
To compare two versions of the client, run it twice with PYTHONPATH naming the other one's
`llm_replay` tree first (replay run inherits it). Skips, with the reason, without tcpdump or root.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_overhead import REPO, arrivals  # noqa: E402
from contention import runqueue, stop, write_trace  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])))
TOKEN = re.compile(rb'"(?:text|content|reasoning_content|reasoning)": ?"[^"]')


def read_pcap(path: str, port: int) -> dict[str, tuple[float, list[float]]]:
    """request_id -> (request time, token event times) from a loopback capture (CLOCK_REALTIME)."""
    raw = Path(path).read_bytes()
    nano = struct.unpack("<I", raw[:4])[0] == 0xA1B23C4D
    link = struct.unpack("<I", raw[20:24])[0]
    off, seen, conns = 24, {}, defaultdict(list)
    while off + 16 <= len(raw):
        sec, frac, incl, _ = struct.unpack("<IIII", raw[off:off + 16])
        p = raw[off + 16:off + 16 + incl]
        off += 16 + incl
        p = p[14:] if link == 1 else p[16:] if link == 113 else p[4:]   # Ethernet (lo), Linux cooked, null
        if len(p) < 20 or p[0] >> 4 != 4 or p[9] != 6:
            continue
        tcp = p[(p[0] & 15) * 4:]
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        pay = tcp[(tcp[12] >> 4) * 4:]
        if not pay:
            continue
        end, k = seq + len(pay), (sport, dport)
        if k in seen and (end - seen[k]) % 2**32 > 2**31 or seen.get(k) == end:
            continue   # a retransmission (lo has them too): keep the first copy
        seen[k] = end
        conns[dport if sport == port else sport].append((sec + frac / (1e9 if nano else 1e6), sport == port, pay))
    out = {}
    for pkts in conns.values():
        req, cur = b"", None
        for t, from_server, pay in pkts:
            if not from_server:
                req += pay
                m = re.search(rb'"prompt": ?"([^"]*)"', req)
                if m:
                    cur = out[m.group(1).decode()] = (t, [])
                    req = b""
            elif cur is not None:
                cur[1].extend([t] * len(TOKEN.findall(pay)))
    return out


def measure(run: str, wire: dict) -> dict:
    info = json.loads(Path(run, "run.json").read_text())
    r = pq.read_table(Path(run, "records.parquet"), columns=["request_id", "status", "sent_s", "token_times"]).to_pydict()
    zero = gaps = matched = 0
    ttft, tok = [], []
    for rid, st, sent, tt in zip(r["request_id"], r["status"], r["sent_s"], r["token_times"]):
        w = wire.get(rid)
        if st != "ok" or not w or len(w[1]) != len(tt) or not tt:
            continue
        matched += 1
        rec = info["t0_wall"] + sent + np.asarray(tt)
        wt = np.asarray(w[1])
        err = (rec - wt) * 1e3
        ttft.append(err[0])
        tok.extend(err)
        rg, wg = np.diff(rec), np.diff(wt)
        zero += int(np.sum((rg == 0) & (wg > 1e-4)))
        gaps += len(rg)
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")   # noqa: E731
    return {"n": len(r["status"]), "matched": matched, "zero": zero / gaps if gaps else float("nan"),
            "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "ttft_max": max(ttft, default=float("nan")),
            "tok_p99": pct(tok, 99), "tok_max": max(tok, default=float("nan"))}


@contextmanager
def spinners(n: int, own_session: bool):
    """n pure-Python busy loops, in sessions (with autogroups: CPU groups) of their own or in ours,
    the runner's: then they compete with it inside its group, as a busy runner host's work does."""
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=own_session))
        time.sleep(1.0)
        yield procs
    finally:
        for p in procs:
            stop(p)


def one(a, cond: str, tmp: str, times: list[float]) -> dict:
    server = subprocess.Popen([sys.executable, "-m", "tests.replay.sse_server", "--host", "127.0.0.1", "--port", "0",
                               "--tokens", str(a.tokens), "--first-delay", str(a.ttft), "--interval", str(a.interval)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=REPO,
                              start_new_session=True)
    cap = f"{tmp}/{cond}.pcap"
    dump = None
    try:
        line = server.stdout.readline()
        if not line.startswith("sse-server ready: "):
            raise SystemExit(f"the SSE server did not start: {line!r}")
        url = line.split(": ", 1)[1].strip()
        port = int(url.rsplit(":", 1)[1].strip("/"))
        dump = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "0", "-n", "--time-stamp-precision=nano", "-w", cap,
                                 f"tcp port {port}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(100):   # the file appears once the capture is open
            if os.path.exists(cap):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        trace, out = f"{tmp}/{cond}.parquet", f"{tmp}/run-{cond}"
        write_trace(trace, times, a.tokens, f"{cond}-")
        cmd = [sys.executable, "-m", "llm_replay.replay", "run", "--trace", trace, "--target", url, "-o", out,
               "--no-check", "--no-progress"] + (["--realtime"] if cond == "realtime" else [])
        with spinners(a.busy if cond != "quiet" else 0, not a.spin_here), runqueue() as rq:
            done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO, timeout=a.duration * 3 + 120)
        if done.returncode:
            raise SystemExit(f"replay run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        time.sleep(0.5)
        dump.send_signal(signal.SIGINT)   # it writes out what it buffered, then its counts
        drops = re.search(r"(\d+) packets dropped by kernel", dump.communicate(timeout=30)[1])
        res = measure(out, read_pcap(cap, port))
        res.update(runq=float(np.mean(rq)) if rq else float("nan"), dropped=int(drops.group(1)) if drops else -1)
        return res
    finally:
        if dump is not None:
            stop(dump)
        stop(server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of trace per condition")
    ap.add_argument("--rate", type=float, default=10.0, help="requests per second (Poisson)")
    ap.add_argument("--tokens", type=int, default=30, help="token events per request")
    ap.add_argument("--ttft", type=float, default=0.05, help="server seconds to the first token")
    ap.add_argument("--interval", type=float, default=0.02, help="server seconds between tokens")
    ap.add_argument("--busy", type=int, default=3, help="spinning processes, each in its own session")
    ap.add_argument("--spin-here", action="store_true", help="the spinners in our session (the runner's CPU "
                    "group), not each in one of its own")
    ap.add_argument("--realtime", action="store_true", help="also the busy host with replay run --realtime")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", metavar="DIR", help="keep the traces, captures and run directories in DIR")
    a = ap.parse_args()
    if not shutil.which("tcpdump"):
        print("skipped: tcpdump is not installed (apt-get install tcpdump)")
        return
    if os.geteuid() != 0:
        print(f"skipped: capturing on lo needs root; running as uid {os.geteuid()}")
        return
    times = arrivals(a.rate, a.duration, a.seed)
    import llm_replay.replay.client as client
    print(f"{len(times)} requests, {a.rate:g} req/s over {a.duration:g} s, {a.tokens} token events each "
          f"({a.ttft * 1e3:g} ms to the first, then {a.interval * 1e3:g} ms apart); {os.cpu_count()} CPUs; "
          f"client {client.__file__}; times in ms", flush=True)
    conds = ["quiet", "busy"] + (["realtime"] if a.realtime else [])
    res = {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        for cond in conds:
            res[cond] = one(a, cond, tmp, times)
            print(f"{cond}: done", flush=True)
    print(f"\n{'':>8} {'matched':>9} {'zero gaps':>9}  {'TTFT err p50':>12} {'p99':>7} {'max':>7}  "
          f"{'token err p99':>13} {'max':>7}  {'runq':>4} {'dropped':>7}")
    for cond, r in res.items():
        print(f"{cond:>8} {r['matched']:>4}/{r['n']:<4} {r['zero'] * 100:8.2f}%  {r['ttft_p50']:12.3f} {r['ttft_p99']:7.3f} "
              f"{r['ttft_max']:7.2f}  {r['tok_p99']:13.3f} {r['tok_max']:7.2f}  {r['runq']:4.1f} {r['dropped']:>7}")


if __name__ == "__main__":
    main()
