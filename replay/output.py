"""The run directory's writer side in the runner process: records, progress (scraping: scrape.py).

`Output.recorder` receives records (from the local Job, or as batches from workers); a
flusher greenlet hands them to `records.arrows` at least every second; `close` finalises
`records.parquet` (and `server_metrics.parquet`) and returns the status counts.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import gevent
import gevent.event
import pyarrow as pa

from . import plan
from .progress import Progress
from .recorder import RECORDS_FILE, RECORDS_STREAM, IpcFile, Recorder, finalize

FLUSH_EVERY_S = 0.4   # a record reaches records.arrows within two of these (< 1 s)
FLUSH_ROWS = 128      # records per batch


def flush_periodically(recorder: Recorder, until: gevent.event.Event | None = None) -> None:
    """A greenlet's loop (the runner's, a worker's): every FLUSH_EVERY_S, the records that
    waited a whole period, in batches that yield to the hub between them."""
    while until is None or not until.is_set():
        gevent.sleep(FLUSH_EVERY_S)
        recorder.flush_stale(FLUSH_ROWS, gevent.sleep)


def update_run_json(run_dir: str | Path, **fields) -> None:
    """Merge `fields` into run.json atomically (a reader never sees half a file)."""
    path = Path(run_dir) / "run.json"
    info = json.loads(path.read_text()) if path.exists() else {}
    info.update(fields)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(plan.dumps(info))
    os.replace(tmp, path)


class Output:
    def __init__(self, config: plan.RunConfig) -> None:
        self.config = config
        self.dir = Path(config.run_dir)
        self.file = IpcFile(self.dir / RECORDS_STREAM)
        self.recorder = Recorder(self.write)
        self.progress = Progress(config.rows, config.window_s)
        self.greenlets: list[gevent.Greenlet] = []
        # its own process (parsing a /metrics page stalls an event loop), started now so that
        # its imports are done before T0; it starts sampling when run.json holds T0
        from . import scrape
        self.scraper = scrape.start(self.dir)

    def write(self, batch: pa.RecordBatch) -> None:
        self.file(batch)
        self.progress.add(batch)

    def start(self, t0_wall: float, t0_perf: float) -> None:
        # t0_monotonic: T0 on this host's CLOCK_MONOTONIC (perf_counter on Linux), to join the
        # records with other processes' monotonic stamps (a server's own logs)
        update_run_json(self.dir, t0_wall=t0_wall, t0_monotonic=t0_perf)
        self.progress.t0 = t0_perf
        self.greenlets.append(gevent.spawn(flush_periodically, self.recorder))
        if self.config.progress:
            self.greenlets.append(gevent.spawn(self.progress.run))

    def close(self) -> dict[str, int]:
        gevent.killall(self.greenlets, block=True, timeout=5)
        self.recorder.flush()
        self.file.close()
        if self.scraper is not None:   # stdin closed: it finalises server_metrics.parquet
            self.scraper.stdin.close()
            try:
                self.scraper.wait(15)
            except Exception:  # noqa: BLE001 - a stuck scraper must not keep the run open
                self.scraper.kill()
        if self.config.progress:
            print(("\n" if sys.stderr.isatty() else "") + self.progress.line(), file=sys.stderr)
        finalize(self.dir / RECORDS_STREAM, self.dir / RECORDS_FILE)
        return dict(sorted(self.progress.status.items()))
