"""The run directory's writer side in the runner process: records, progress (scraping: scrape.py).

`Output.recorder` receives records (from the local Job, or as batches from workers); a
flusher greenlet hands them to `records.arrows`, and a thread writes those the event loop left
longer (the loop busy with a long computation, a busy host): a record is in the file's kernel
buffers, which outlive a kill -9, within RECORD_DELAY_S of its request's end. `close` finalises
`records.parquet` (and `server_metrics.parquet`) and returns the status counts. A write that
fails (a full disk) stops the run: `error` says why, and records.arrows keeps what was written.

`Progress`, the live line (sent / in flight / done / errors, dispatch lag p99, tokens/s, time
left), counts the records as they are written (so it is exact in distributed runs too) plus the
dispatchers' own sent / in-flight counters; one refreshed line on a terminal, every few seconds
otherwise.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

import gevent.event
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from gevent import monkey

from . import plan
from .recorder import RECORDS_FILE, RECORDS_STREAM, IpcFile, Recorder, finalize

RECORD_DELAY_S = 1.0  # the promise: a record is in records.arrows this long after its request's end
FLUSH_EVERY_S = 0.3   # the event loop's flusher: a record reaches records.arrows within two of these
WATCH_S = 0.2         # the watch thread: within four of these, whatever the event loop is doing
FLUSH_ROWS = 128      # records per batch


def flush_periodically(recorder: Recorder, until: gevent.event.Event | None = None) -> None:
    """A greenlet's loop (the runner's, a worker's): every FLUSH_EVERY_S, the records that
    waited a whole period, in batches that yield to the hub between them."""
    while until is None or not until.is_set():
        gevent.sleep(FLUSH_EVERY_S)
        recorder.flush_stale(FLUSH_ROWS, gevent.sleep)


def update_run_json(run_dir: str | Path, **fields) -> None:
    """Merge `fields` into run.json atomically (a reader never sees half a file); on a full disk,
    in place: the blocks run.json already holds usually take the few bytes a status adds."""
    path = Path(run_dir) / "run.json"
    info = json.loads(path.read_text()) if path.exists() else {}
    info.update(fields)
    tmp, text = path.with_suffix(".json.tmp"), plan.dumps(info)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        if not path.exists():
            raise
        with open(path, "r+") as f:
            f.write(text)
            f.truncate()


class Output:
    def __init__(self, config: plan.RunConfig) -> None:
        self.config = config
        self.dir = Path(config.run_dir)
        self.file = IpcFile(self.dir / RECORDS_STREAM)
        self.lock = monkey.get_original("_thread", "RLock")()   # the hub and the watch thread write
        self.recorder = Recorder(self.write, self.lock)
        self.watch = None
        self.progress = Progress(config.rows, config.window_s)
        self.greenlets: list[gevent.Greenlet] = []
        self.error: str | None = None      # why the records could not be written
        self.stop = lambda now: None       # stops the run (set by the runner)
        self.hub = gevent.get_hub()
        # its own process (parsing a /metrics page stalls an event loop), started now so that
        # its imports are done before T0; it starts sampling when run.json holds T0
        from . import scrape
        self.scraper = scrape.start(self.dir)

    def write(self, batch: pa.RecordBatch) -> None:
        with self.lock:
            if self.error:
                return
            try:
                self.file(batch)
            except OSError as e:
                return self.failed(e, self.file.path)
            self.progress.add(batch)

    def failed(self, e: OSError, path) -> None:
        """A write failed (ENOSPC, EFBIG, EDQUOT...): stop the run (from the hub, whichever thread
        wrote), keep the first reason."""
        if self.error is None:
            self.error = (f"cannot write {path}: {os.strerror(e.errno) if e.errno else e}; the run stopped with "
                          f"{self.progress.done:,} of {self.config.rows:,} trace rows recorded")
            self.hub.loop.run_callback_threadsafe(gevent.spawn, self.stop, True)

    def _watch(self) -> None:
        """A native thread: every WATCH_S, write the records still buffered that were added three
        wakes ago (so at most 4 WATCH_S ago). The hub's flusher leaves none in a running loop;
        a hub held by a long computation (the rows left after a stop, a graph's read-ahead) or a
        busy host leaves them to this thread, which gets the GIL within the switch interval."""
        sleep = monkey.get_original("time", "sleep")
        marks: deque[int] = deque(maxlen=4)
        while self.watch is not None:
            sleep(WATCH_S)
            marks.append(self.recorder.count)
            if len(marks) == marks.maxlen:
                self.recorder.flush_to(marks[0], FLUSH_ROWS)

    def start(self, t0_wall: float, t0_perf: float) -> None:
        # t0_monotonic: T0 on this host's CLOCK_MONOTONIC (perf_counter on Linux), to join the
        # records with other processes' monotonic stamps (a server's own logs)
        update_run_json(self.dir, t0_wall=t0_wall, t0_monotonic=t0_perf)
        self.progress.t0 = t0_perf
        self.greenlets.append(gevent.spawn(flush_periodically, self.recorder))
        self.watch = gevent.get_hub().threadpool.spawn(self._watch)
        if self.config.progress:
            self.greenlets.append(gevent.spawn(self.progress.run))

    def close(self) -> dict[str, int]:
        gevent.killall(self.greenlets, block=True, timeout=5)
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.get()
        self.recorder.flush(max_rows=32 * FLUSH_ROWS)   # oldest first, each batch soon on disk
        try:
            self.file.close()
        except OSError as e:
            self.failed(e, self.file.path)
        if self.scraper is not None:   # stdin closed: it finalises server_metrics.parquet
            self.scraper.stdin.close()
            try:
                self.scraper.wait(15)
            except Exception:  # noqa: BLE001 - a stuck scraper must not keep the run open
                self.scraper.kill()
        if self.config.progress:
            print(("\n" if sys.stderr.isatty() else "") + self.progress.line(), file=sys.stderr)
        if not self.error:   # else records.arrows holds what was written, as after a kill
            try:
                finalize(self.dir / RECORDS_STREAM, self.dir / RECORDS_FILE)
            except OSError as e:
                self.failed(e, self.dir / RECORDS_FILE)
                (self.dir / RECORDS_FILE).with_suffix(".parquet.tmp").unlink(missing_ok=True)
        return dict(sorted(self.progress.status.items()))


class Progress:
    def __init__(self, total: int, duration_s: float) -> None:
        self.total, self.duration_s, self.t0 = total, duration_s, None   # t0: on perf_counter, from start
        self.done = self.errors = 0
        self.status: Counter[str] = Counter()
        self.lags: deque = deque(maxlen=4096)
        self.tok_window: deque = deque()   # (perf time, tokens) over the last seconds
        self.live: Callable[[], tuple[int, int]] = lambda: (self.done, 0)  # (sent, in flight)

    def add(self, batch: pa.RecordBatch) -> None:
        """Count a batch of finished records."""
        counts = pc.value_counts(batch.column("status")).to_pylist()   # one pass: a flush holds the hub
        self.status.update({v["values"]: v["counts"] for v in counts})
        # done: requests that ended (a Ctrl-C's cancelled and not_sent rows are counted apart)
        self.done += sum(v["counts"] for v in counts if v["values"] not in ("not_sent", "cancelled"))
        self.errors += sum(v["counts"] for v in counts if v["values"] not in ("ok", "not_sent", "cancelled"))
        self.tok_window.append((time.perf_counter(), pc.sum(batch.column("completion_tokens")).as_py() or 0))
        lag = pc.subtract(batch.column("sent_s"), batch.column("scheduled_s")).drop_null()
        self.lags.extend(lag.to_numpy()[-1024:])

    def line(self) -> str:
        now = time.perf_counter()
        sent, inflight = self.live()
        while self.tok_window and self.tok_window[0][0] < now - 5:
            self.tok_window.popleft()
        span = min(5.0, now - self.t0) if self.t0 and now > self.t0 else 5.0
        tps = sum(t for _, t in self.tok_window) / max(span, 1e-3)
        lag = f"{np.percentile(np.asarray(self.lags), 99) * 1e3:.1f} ms" if self.lags else "-"
        elapsed = now - self.t0 if self.t0 else 0.0
        left = max(0.0, self.duration_s - elapsed)
        stopped = "".join(f"  {k.replace('_', ' ')} {self.status[k]}" for k in ("cancelled", "not_sent")
                          if self.status.get(k))
        return (f"[{elapsed:7.1f}s] sent {sent}/{self.total}  in flight {inflight}  done {self.done}  "
                f"errors {self.errors}{stopped}  lag p99 {lag}  tok/s {tps:.0f}  left {left:.0f}s")

    def run(self) -> None:
        """Print to stderr forever (a greenlet or thread); the caller kills it."""
        tty = sys.stderr.isatty()
        while True:
            time.sleep(0.5 if tty else 5.0)
            sys.stderr.write(("\r" + self.line() + "\x1b[K") if tty else self.line() + "\n")
            sys.stderr.flush()
