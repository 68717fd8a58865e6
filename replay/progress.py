"""Live progress of a run: sent / in flight / done / errors, dispatch lag p99, tokens/s, time left.

Counts come from the records as they are written (so they are exact in distributed runs
too) plus the dispatchers' own sent / in-flight counters. Printed on one refreshed line on a
terminal, every few seconds otherwise.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Progress:
    def __init__(self, total: int, duration_s: float, t0_perf: float | None = None) -> None:
        self.total, self.duration_s, self.t0 = total, duration_s, t0_perf
        self.done = self.errors = self.tokens = 0
        self.status: dict[str, int] = {}
        self.lags: deque = deque(maxlen=4096)
        self.tok_window: deque = deque()   # (perf time, tokens) over the last seconds
        self.live: Callable[[], tuple[int, int]] = lambda: (self.done, 0)  # (sent, in flight)

    def add(self, batch: pa.RecordBatch) -> None:
        """Count a batch of finished records."""
        counts = pc.value_counts(batch.column("status")).to_pylist()   # one pass: a flush holds the hub
        for v in counts:
            self.status[v["values"]] = self.status.get(v["values"], 0) + v["counts"]
        # done: requests that ended (a Ctrl-C's cancelled and not_sent rows are counted apart)
        self.done += sum(v["counts"] for v in counts if v["values"] not in ("not_sent", "cancelled"))
        self.errors += sum(v["counts"] for v in counts if v["values"] not in ("ok", "not_sent", "cancelled"))
        toks = pc.sum(batch.column("completion_tokens")).as_py() or 0
        self.tokens += toks
        self.tok_window.append((time.perf_counter(), toks))
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

    def run(self, stream=sys.stderr, every: float | None = None) -> None:
        """Print forever (a greenlet or thread); the caller kills it."""
        tty = stream.isatty()
        every = every or (0.5 if tty else 5.0)
        while True:
            time.sleep(every)
            stream.write(("\r" + self.line() + "\x1b[K") if tty else self.line() + "\n")
            stream.flush()
