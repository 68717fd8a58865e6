"""The master's ceiling: records per second a distributed run's master takes in from its workers.

    python3 benchmarks/master_ceiling.py [--workers 4,8] [--records 200000] [--tokens 100] [--batch 128]
                                         [--modes live,burst] [--profile FILE]

On a small machine N workers cannot each make thousands of real HTTP requests per second, so
this measures the master's intake on its own. For each worker count one run starts
  master   the real runner (`python -m llm_replay.replay.runner RUN_DIR`, the code of
           `replay run --remote-workers N`: Locust master + replay.master.Master + Output),
           pinned alone on CPU 0;
  workers  N real `replay worker` processes (replay.worker.WorkerSide: MessageFeed, Recorder,
           the periodic flusher, `_ship`), all on the other CPU(s), whose Job is replaced by a
           synthetic one that turns every row the master ships into a finished record at once, as
           if the server answered instantly (`recorder.record` of a StreamResult with `--tokens`
           +-50% token stamps), flushed in batches of `--batch` records (default FLUSH_ROWS, the
           size a busy worker's flusher ships) through the real Arrow IPC + Locust RPC path:
    live   from T0, rows become records as they arrive: the master ships rows and takes records
           at once, as in a run (on 2 cores bound by the workers' CPU: a lower bound);
    burst  every row fetched and every record built before T0 (a longer lead), all sent at T0:
           the master's record intake alone, as fast as it can take them.
The master does all its real work: reading and sharding the trace, shipping rows, receiving
records over Locust's RPC (msgpack over zmq), accounting, writing records.arrows, progress, and
finalising records.parquet (checked: one record per row, unique ids). records/s = rows / (the
moment the master holds every record, run.json's client_cpu_s appearing, - T0); "incl. parquet"
adds the finalise (ended_wall). CPU = user+sys of the process(es) over that interval (100% = one
core). MB/s = records/s x bytes a record on the wire (Locust's msgpack frame + Arrow IPC payload).
others: the cores other processes on the host took meanwhile (a noisy machine: rerun).

Baseline, measured in the same run on the master's CPU: one process taking the very same message
bytes off the wire format (msgpack, then Arrow IPC) and appending the batches to an Arrow IPC file:
no RPC, no sockets, no bookkeeping. ratio = records/s into the master / baseline.
Target: >= 20k records/s into the master.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TARGET = 20_000


def results(tokens: int, t0: float, k: int = 16) -> list:
    """k finished requests (StreamResult, perf_counter times as the client stamps them) sent 1 ms
    apart from t0, with tokens/2 .. 3*tokens/2 token stamps 20 ms apart after a 50 ms TTFT."""
    from array import array

    from llm_replay.replay.client import StreamResult
    out = []
    for j in range(k):
        sent, n = t0 + 0.001 * j, max(1, round(tokens * (0.5 + j / max(1, k - 1))))
        tt = array("d", (sent + 0.05 + 0.02 * i for i in range(n)))
        out.append(StreamResult(status="ok", http_status=200, sent=sent, first_token=tt[0], last_token=tt[-1],
                                first_answer=tt[0], token_times=tt, prompt_tokens=20, completion_tokens=n,
                                reused_connection=True))
    return out


# --- a synthetic worker --------------------------------------------------------------------------
def worker_main(master: str, tokens: int, batch: int, mode: str) -> int:
    from gevent import monkey
    monkey.patch_all()
    import gevent
    from gevent.event import Event

    import llm_replay.replay.dispatcher as dispatcher
    from llm_replay.replay import plan
    from llm_replay.replay.recorder import record
    from llm_replay.replay.worker import run_worker

    class SyntheticJob:
        """A Job whose server answers instantly: every row becomes a finished record at once."""

        def __init__(self, config, worker, t0, feed, recorder, env=None) -> None:
            self.c, self.worker, self.t0, self.feed, self.rec = config, worker, t0, feed, recorder
            self.pool, self.finished, self.stopping = None, Event(), False
            self.sent = self.errors = self.in_flight = 0

        def run(self) -> None:
            try:
                if mode == "burst":
                    self.burst()
                else:
                    gevent.sleep(max(0.0, self.t0 - time.perf_counter()))
                    self.synthesize()
            finally:
                self.finished.set()

        def synthesize(self) -> None:
            res = results(tokens, self.t0 + 0.01)
            k, rec, tm = len(res), self.rec, self.c.target_model
            for chunk in self.feed:
                for row in chunk:
                    rec.add(record(row, tm(row[plan.MODEL]), self.worker, self.t0, res[self.sent % k]))
                    self.sent += 1
                    if len(rec.buf) >= batch:   # (flush replaces the list)
                        rec.flush(batch)
                        gevent.sleep(0)

        def burst(self) -> None:
            """Every record built before T0 (all rows fetched), then shipped at T0 as fast as the
            worker can serialise and send them (WorkerSide._ship)."""
            ship, batches = self.rec.sink, []
            self.rec.sink = batches.append
            self.synthesize()
            self.rec.flush()
            self.rec.sink = ship
            late = time.perf_counter() - self.t0
            if late > 0:
                print(f"LATE: worker {self.worker} built its records {late:.2f} s after T0", flush=True)
            gevent.sleep(max(0.0, self.t0 - time.perf_counter()))
            for b in batches:
                ship(b)

        def pool_for(self, label):   # WorkerSide's --preconnect (0 here: never used)
            return None

        def stop(self) -> None:
            self.stopping = True

        def close(self) -> None:
            pass

    dispatcher.Job = SyntheticJob      # WorkerSide._setup imports Job from here when the run starts
    return run_worker(master, tie_to_parent=True)


# --- the baseline ------------------------------------------------------------------------------
def payloads(n: int, tokens: int, batch: int) -> list[bytes]:
    """The records of n rows as the workers put them on the wire: Locust's msgpack frame around
    WorkerSide._ship's IPC bytes, one message per `batch` records."""
    import pyarrow as pa
    from locust.rpc.protocol import Message

    from llm_replay.replay import plan
    from llm_replay.replay.recorder import Recorder, record
    out: list[bytes] = []

    def ship(b) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, b.schema) as w:
            w.write_batch(b)
        out.append(Message("replay_records", {"ipc": sink.getvalue().to_pybytes(), "stats": [n, 0]},
                           "worker-0123456789abcdef").serialize())
    res = results(tokens, 0.01)
    rec = Recorder(ship)
    for i in range(n):
        rec.add(record((i, str(i), 1e-6 * i, 20, tokens, *[None] * (plan.ROW_LEN - 5)),  # a plan row: IDX, RID, SCHED, IN, OUT
                       "m", 0, 0.0, res[i % len(res)]))
        if len(rec.buf) >= batch:
            rec.flush(batch)
    rec.flush()
    return out


def baseline_main(n: int, tokens: int, batch: int) -> dict:
    import pyarrow as pa
    from locust.rpc.protocol import Message

    from llm_replay.replay.recorder import IpcFile
    msgs = payloads(n, tokens, batch)
    with tempfile.TemporaryDirectory() as tmp:
        f = IpcFile(Path(tmp) / "records.arrows")
        c0, t = time.process_time(), time.perf_counter()
        rows = 0
        for m in msgs:
            d = Message.unserialize(m).data
            for b in pa.ipc.open_stream(pa.py_buffer(d["ipc"])).read_all().to_batches():
                f(b)
                rows += b.num_rows
        f.close()
        wall, cpu = time.perf_counter() - t, time.process_time() - c0
    assert rows == n
    return {"rate": n / wall, "cpu": cpu / wall, "bytes_per_record": sum(map(len, msgs)) / n,
            "messages": len(msgs)}


# --- one distributed run --------------------------------------------------------------------------
def write_trace(path: Path, n: int, tokens: int) -> None:
    import numpy as np
    import pyarrow as pa

    from llm_replay.traces.trace import Trace
    Trace(pa.table({"arrival_ns": (np.arange(n) * 1000).astype("int64"),   # all due within n ms
                    "input_tokens": np.full(n, 20, "int32"),
                    "output_tokens": np.full(n, tokens, "int32")})).write(str(path))


def pin(cpus: set[int] | None):
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus and hasattr(os, "sched_setaffinity") else None


def cpu_of(procs) -> float:
    import psutil
    s = 0.0
    for p in procs:
        try:
            t = psutil.Process(p.pid).cpu_times()
            s += t.user + t.system
        except psutil.Error:
            pass
    return s


def run_master(trace: Path, tmp: Path, workers: int, tokens: int, batch: int, cpus: tuple, mode: str,
               profile: str | None = None) -> dict:
    import pyarrow.parquet as pq

    from llm_replay.replay import plan
    from llm_replay.replay.parent import TICK, host_ticks, prepare_run_dir
    from llm_replay.replay.runner import _free_port
    port = _free_port()
    run_dir = tmp / f"run-{mode}-{workers}"
    c = plan.RunConfig(trace=str(trace), target="http://127.0.0.1:9", run_dir=str(run_dir), workers=0,
                       remote_workers=workers, master_host="127.0.0.1", master_port=port, progress=False)
    c.rows, c.window_s = plan.scan(c)
    c.lead_s = 3.0 + (2e-5 * c.rows if mode == "burst" else 0.0)   # burst: time to build every record
    c.block_size = plan.trace_block_size(c.trace)
    prepare_run_dir(c, {})
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(tmp / f"log-{mode}-{workers}.txt", "w")
    prof = ["-m", "cProfile", "-o", profile] if profile else []
    master = subprocess.Popen([sys.executable, *prof, "-m", "llm_replay.replay.runner", str(run_dir)], env=env, cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin(cpus[0]))
    ws = [subprocess.Popen([sys.executable, __file__, "--role", "worker", "--master", f"127.0.0.1:{port}",
                            "--tokens", str(tokens), "--batch", str(batch), "--mode", mode], env=env, cwd=REPO,
                           stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin(cpus[1]))
          for _ in range(workers)]
    info = lambda: json.loads((run_dir / "run.json").read_text())   # noqa: E731
    try:
        deadline = time.time() + 60 + 2 * workers
        while "t0_wall" not in info():
            if time.time() > deadline or master.poll() is not None:
                raise SystemExit(f"the master never reached T0; see {log.name}:\n" + Path(log.name).read_text()[-3000:])
            time.sleep(0.02)
        t0 = info()["t0_wall"]
        time.sleep(max(0.0, t0 - time.time()))
        m0, w0, h0 = cpu_of([master]), cpu_of(ws), host_ticks()
        deadline = time.time() + 120
        while "client_cpu_s" not in info():   # written the moment the master holds every record
            if time.time() > deadline or master.poll() is not None:
                raise SystemExit(f"the master stopped before the end; see {log.name}:\n" + Path(log.name).read_text()[-3000:])
            time.sleep(0.005)
        t_in = time.time()
        m1, w1, h1 = cpu_of([master]), cpu_of(ws), host_ticks()
        master.wait(timeout=120)
        end = info()
    finally:
        for p in [master, *ws]:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        log.close()
    if "LATE:" in Path(log.name).read_text():
        print("warning: some workers had not built their records by T0: this burst figure is low")
    rows = pq.read_metadata(run_dir / "records.parquet").num_rows
    ids = pq.read_table(run_dir / "records.parquet", columns=["request_id"]).column("request_id")
    assert rows == c.rows and len(ids.unique()) == rows, (rows, c.rows)
    intake = t_in - t0
    return {"mode": mode, "workers": workers, "rows": rows, "intake_s": intake, "rate": rows / intake,
            "total_rate": rows / (end["ended_wall"] - t0), "master_cpu": (m1 - m0) / intake,
            "workers_cpu": (w1 - w0) / intake, "status": end["status"],
            # other processes' CPU meanwhile (host busy minus ours), in cores: a noisy neighbour
            # (10 ms ticks: within +-0.2 core over a ~1 s intake, so clamped at 0)
            "others": max(0.0, ((h1[0] - h0[0]) * TICK - (m1 - m0) - (w1 - w0)) / intake) if h0 and h1 else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="4,8")
    ap.add_argument("--records", type=int, default=200_000, help="trace rows (= records) per run")
    ap.add_argument("--tokens", type=int, default=100, help="mean token stamps per record (+-50%%)")
    ap.add_argument("--batch", type=int, default=None, help="records per worker message (default: the "
                    "dispatcher's QUIET_ROWS)")
    ap.add_argument("--modes", default="live,burst", help="live: workers turn rows into records as they "
                    "arrive, from T0; burst: records built before T0, all sent at T0 (the master's intake alone)")
    ap.add_argument("--mode", default="live", help=argparse.SUPPRESS)
    ap.add_argument("--profile", metavar="FILE", help="run the master under cProfile (FILE-<workers>.prof) "
                    "and print its top functions")
    ap.add_argument("--role", choices=("worker", "baseline"), help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.batch is None:
        from llm_replay.replay.output import FLUSH_ROWS
        a.batch = FLUSH_ROWS
    if a.role == "worker":
        raise SystemExit(worker_main(a.master, a.tokens, a.batch, a.mode))
    if a.role == "baseline":
        print(json.dumps(baseline_main(a.records, a.tokens, a.batch)))
        return
    ncpu = os.cpu_count() or 1
    cpus = ({0}, set(range(1, ncpu))) if ncpu > 1 else (None, None)
    if cpus[1]:
        os.sched_setaffinity(0, cpus[1])   # this driver's polling stays off the master's CPU
    env = dict(os.environ, PYTHONPATH=str(REPO))
    base = json.loads(subprocess.run([sys.executable, __file__, "--role", "baseline", "--records", str(a.records),
                                      "--tokens", str(a.tokens), "--batch", str(a.batch)], env=env, cwd=REPO,
                                     check=True, capture_output=True, text=True, preexec_fn=pin(cpus[0]),
                                     timeout=300).stdout.strip().splitlines()[-1])
    bpr = base["bytes_per_record"]
    print(f"{a.records} records of {a.tokens} +-50% token stamps, {a.batch} records a message, "
          f"{bpr:.0f} bytes a record on the wire (msgpack frame + Arrow IPC); master on cpu {sorted(cpus[0] or [])}, "
          f"workers on cpus {sorted(cpus[1] or [])}")
    print(f"baseline (one process, same bytes -> records.arrows, no RPC): {base['rate']:,.0f} records/s")
    print(f"{'mode':>5} {'workers':>7} {'records/s':>10} {'MB/s':>6} {'master CPU':>10} {'workers CPU':>11} "
          f"{'ratio':>6} {'incl. parquet':>13} {'others':>6}  target >= {TARGET // 1000}k/s")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.parquet"
        write_trace(trace, a.records, a.tokens)
        for mode, w in ((m, w) for m in a.modes.split(",") for w in map(int, a.workers.split(","))):
            prof = f"{a.profile}-{mode}-{w}.prof" if a.profile else None
            r = run_master(trace, Path(tmp), w, a.tokens, a.batch, cpus, mode, prof)
            print(f"{mode:>5} {w:>7} {r['rate']:>10,.0f} {r['rate'] * bpr / 1e6:>6.1f} {r['master_cpu'] * 100:>9.0f}% "
                  f"{r['workers_cpu'] * 100:>10.0f}% {r['rate'] / base['rate']:>6.2f} {r['total_rate']:>13,.0f} {r['others']:>6.2f}  "
                  f"{'met' if r['rate'] >= TARGET else 'NOT met'}", flush=True)
            if prof:
                import pstats
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
