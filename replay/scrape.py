"""`--scrape [MODEL=]URL`: sample the targets' Prometheus metrics during the run.

Every interval the text exposition is fetched, parsed with prometheus_client's parser,
and appended (one row per sample, time relative to T0) to an IPC stream that `close`
finalises into `server_metrics.parquet` (reports.schema.SERVER_METRICS_SCHEMA).
A failed scrape is counted and retried at the next tick; it never disturbs the replay.
"""
from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from llm_replay.reports.schema import SERVER_METRICS_SCHEMA

from .recorder import IpcFile, finalize

STREAM, FILE = "server_metrics.arrows", "server_metrics.parquet"


def parse_samples(text: str, t: float, extra: dict | None = None) -> pa.RecordBatch:
    """One row per sample; `extra` labels (a per-model deployment's `target`) join each sample's."""
    rows = [(t, s.name, json.dumps({**s.labels, **extra} if extra else s.labels, sort_keys=True)
             if s.labels or extra else None, float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]
    cols = list(zip(*rows)) if rows else [[], [], [], []]
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SERVER_METRICS_SCHEMA)],
                                      schema=SERVER_METRICS_SCHEMA)


class Scraper:
    """Samples `urls` (a URL, or (URL, target) pairs: that target's samples carry a `target` label)."""

    def __init__(self, urls, run_dir: str | Path, t0_perf: float, interval_s: float = 1.0) -> None:
        self.sources = [(urls, None)] if isinstance(urls, str) else list(urls)
        self.url = ", ".join(u for u, _ in self.sources)
        self.dir, self.t0, self.interval = Path(run_dir), t0_perf, max(0.05, interval_s)
        self.file = IpcFile(self.dir / STREAM, SERVER_METRICS_SCHEMA)
        self.ok = self.failed = 0
        self.last_error: str | None = None

    def scrape_once(self) -> None:
        for url, target in self.sources:
            t = time.perf_counter() - self.t0
            try:
                with urllib.request.urlopen(url, timeout=max(1.0, self.interval)) as r:
                    text = r.read().decode("utf-8", "replace")
                self.file(parse_samples(text, t, {"target": target} if target else None))
                self.ok += 1
            except Exception as e:  # noqa: BLE001 - a bad scrape must never stop the replay
                self.failed += 1
                self.last_error = f"{url}: {type(e).__name__}: {e}"[:200]

    def run(self) -> None:
        nxt = time.perf_counter()
        while True:
            self.scrape_once()
            nxt += self.interval
            time.sleep(max(0.0, nxt - time.perf_counter()))

    def close(self) -> None:
        self.file.close()
        finalize(self.dir / STREAM, self.dir / FILE, SERVER_METRICS_SCHEMA)
        if self.failed:
            print(f"replay: {self.failed} of {self.ok + self.failed} scrapes of {self.url} failed "
                  f"(last: {self.last_error})", file=sys.stderr)
