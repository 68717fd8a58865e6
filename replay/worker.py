"""A distributed worker: `replay worker --master HOST:PORT` (or `python -m llm_replay.replay.worker`).

It joins a master started by `replay run --workers N` / `--remote-workers M` (or by
`locust --master -f replay/locustfile.py`), receives its configuration, T0 and rows by
custom messages, runs one Job and streams its records back in batches.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import deque


def add_parser(sub) -> None:
    p = sub.add_parser("worker", help="join a distributed replay as a worker",
                       description="Join `replay run --remote-workers N` (or a locust --master "
                                   "running replay's locustfile) from this host.")
    p.add_argument("--master", required=True, metavar="HOST:PORT", help="the master's address")
    p.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=main_args)


class MessageFeed:
    """The worker's rows: chunks from the master, asked for before the buffer runs dry."""

    LOW = 1024

    def __init__(self, ask) -> None:
        from gevent.event import Event
        self.ask, self.chunks, self.n, self.end, self.asked, self.ev = ask, deque(), 0, False, False, Event()

    def put(self, rows: list, end: bool) -> None:
        if rows:
            self.chunks.append([tuple(r) for r in rows])
            self.n += len(rows)
        self.end = self.end or end
        self.asked = False
        self.ev.set()

    def __iter__(self):
        while True:
            chunk = self.chunks.popleft() if self.chunks else []
            self.n -= len(chunk)
            if self.n < self.LOW and not self.end and not self.asked:   # an empty buffer holds < LOW
                self.asked = True
                self.ask()
            if chunk:
                yield chunk
            elif self.end:
                return
            else:
                self.ev.clear()
                self.ev.wait()


class WorkerSide:
    """Message handlers of a worker process (used by `replay worker` and the locustfile)."""

    def __init__(self, env, say=None) -> None:
        """`say`: print progress lines (`replay worker`; local workers stay quiet)."""
        from .process import ProcessContext
        self.env, self.runner, self.say = env, env.runner, say or (lambda line: None)
        self.ctx = env.replay = ProcessContext()
        self.job = self.feed = None
        self.runner.register_message("replay_setup", self._setup)
        self.runner.register_message("replay_rows", self._rows)
        self.runner.register_message("replay_stop", self._stop)

    def _setup(self, environment, msg, **kw) -> None:
        import gevent

        from . import plan
        from .dispatcher import Job
        from .output import flush_periodically
        from .recorder import Recorder
        from .process import cpu_seconds, freeze_gc, perf_at, preconnect
        config = plan.RunConfig.from_json(msg.data["config"])
        self.feed = MessageFeed(lambda: self.runner.send_message("replay_want", {}))
        self.recorder = Recorder(self._ship)
        k = msg.data["worker"]
        self.job = Job(config, k, perf_at(msg.data["t0_wall"]), self.feed, self.recorder, self.env)
        self.ctx.job, self.ctx.on_done = self.job, self._done
        gevent.spawn(flush_periodically, self.recorder, self.job.finished)
        # this worker's share of --preconnect, opened before T0 (stopped short of it if slow)
        n, workers = config.preconnect, max(1, msg.data.get("workers") or 1)
        preconnect(self.job, n // workers + (k < n % workers), deadline=self.job.t0 - 0.1, who=f"worker {k}: ")
        freeze_gc()
        self.cpu0 = cpu_seconds()
        self.ctx.ready.set()
        self.say(f"replaying as worker {k} of {workers}: target {config.describe_targets()}, "
                 f"{config.rows} rows in the run, T0 in {msg.data['t0_wall'] - time.time():.1f} s")

    def _rows(self, environment, msg, **kw) -> None:
        if self.feed is not None:
            self.feed.put(msg.data["rows"], msg.data["end"])

    def _stop(self, environment, msg, **kw) -> None:
        if self.job is not None:
            if msg.data.get("now"):
                self.job.c.grace_s = 0.0
            self.job.stop()

    def _stats(self) -> list[int]:
        return [self.job.sent, self.job.in_flight]

    def _ship(self, batch) -> None:
        import pyarrow as pa
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        self.runner.send_message("replay_records", {"ipc": sink.getvalue().to_pybytes(), "stats": self._stats()})

    def _done(self) -> None:
        from .process import cpu_seconds
        self.recorder.flush()
        self.job.close()
        # Locust's statistics of every request go before replay_done (same socket, in order):
        # the master quits when all workers are done and waits only 0.5 s for final reports.
        self.runner._send_stats()
        self.runner.send_message("replay_done", {"stats": self._stats(), "cpu_s": cpu_seconds() - self.cpu0,
                                                 "unsent_bulk": self.recorder.bulk})
        j = self.job
        self.say(f"worker {j.worker} done: {j.sent} requests sent, {j.errors} failed; "
                 f"waiting for the master to end the run")


def run_worker(master: str, tie_to_parent: bool = False) -> int:
    from gevent import monkey
    monkey.patch_all()
    if tie_to_parent:
        from .process import die_with_parent
        die_with_parent()
    from locust.env import Environment

    from .dispatcher import Dispatcher
    host, _, port = master.rpartition(":")
    if not host or not port.isdigit():
        print(f"error: --master must be HOST:PORT, got {master!r}", file=sys.stderr)
        return 2

    def say(line: str) -> None:   # a local worker of `replay run --workers N` stays quiet
        if not tie_to_parent:
            print(f"replay worker: {line}", file=sys.stderr, flush=True)
    env = Environment(user_classes=[Dispatcher])
    say(f"connecting to master {master} ...")
    try:  # blocks until the master acknowledges (Locust retries for 5 minutes)
        env.create_worker_runner(host, int(port))
    except ConnectionError:
        print(f"error: no master answered at {master}", file=sys.stderr)
        return 2
    WorkerSide(env, say)
    say(f"joined master {master}; waiting for the run to start")
    env.runner.greenlet.join()
    time.sleep(0.2)
    say(f"master {master} ended the run; exiting")
    return 0


def main_args(args) -> None:
    """`replay worker`: re-exec as a clean process, so gevent patches before anything imports ssl."""
    import os
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "llm_replay.replay.worker", "--master", args.master]
    os.execv(sys.executable, argv + (["--die-with-parent"] if args.die_with_parent else []))  # does not return


if __name__ == "__main__":   # the options of `replay worker`, defined once in add_parser
    ap = argparse.ArgumentParser(prog="replay")
    add_parser(ap.add_subparsers())
    a = ap.parse_args(["worker", *sys.argv[1:]])
    raise SystemExit(run_worker(a.master, a.die_with_parent))
