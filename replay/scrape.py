"""`--scrape [MODEL=]URL`: sample the targets' Prometheus metrics during the run.

The scraper is a process of its own (`python -m llm_replay.replay.scrape RUN_DIR`, niced, started
by `replay run` beside its runner, or by the runner's Output on the Locust CLI path): fetching and
parsing a vLLM /metrics page (54 KB) takes ~22 ms of CPU, which inside the runner's event loop
doubled its worst stall (issue 21). It waits for T0 in run.json, then every interval fetches the
text exposition, parses it with prometheus_client's parser and appends it (one row per sample,
time relative to T0) to an IPC stream, finalised into `server_metrics.parquet`
(reports.schema.SERVER_METRICS_SCHEMA) when its standard input closes (the runner is done, or
died). A failed scrape is counted and retried at the next tick; it never disturbs the replay.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from llm_replay.reports.schema import SERVER_METRICS_SCHEMA

from . import plan
from .recorder import IpcFile, finalize

STREAM, FILE = "server_metrics.arrows", "server_metrics.parquet"
NICE = 5   # below the runner: a scrape waits, a send does not


def parse_samples(text: str, t: float, extra: dict | None = None) -> pa.RecordBatch:
    """One row per sample; `extra` labels (a per-model deployment's `target`) join each sample's."""
    rows = [(t, s.name, json.dumps({**s.labels, **extra} if extra else s.labels, sort_keys=True)
             if s.labels or extra else None, float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]
    cols = list(zip(*rows)) if rows else [[], [], [], []]
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SERVER_METRICS_SCHEMA)],
                                      schema=SERVER_METRICS_SCHEMA)


def sources(c: plan.RunConfig) -> list[tuple[str, str | None]]:
    """(metrics URL, target label or None) to scrape; two models on one deployment: one scrape."""
    out = ([(c.scrape_url, c.target if c.targets else None)] if c.scrape_url else []) + \
        [(url, c.target_of(label)) for label, url in c.scrapes.items()]
    return list(dict.fromkeys(out))


class Scraper:
    """Samples `sources` (URL, target or None): a target's samples carry a `target` label."""

    def __init__(self, sources: list, run_dir: str | Path, t0_perf: float, interval_s: float = 1.0) -> None:
        self.sources, self.dir, self.t0, self.interval = sources, Path(run_dir), t0_perf, max(0.05, interval_s)
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

    def run(self, stop: threading.Event) -> None:
        """Scrape every interval until `stop`, then finalise server_metrics.parquet."""
        nxt = time.perf_counter()
        try:
            while not stop.is_set():
                self.scrape_once()
                nxt += self.interval
                stop.wait(max(0.0, nxt - time.perf_counter()))
            self.scrape_once()   # the counters after the last request: the run's increase is complete
        finally:
            self.file.close()
            finalize(self.dir / STREAM, self.dir / FILE, SERVER_METRICS_SCHEMA)
            if self.failed:
                urls = ", ".join(u for u, _ in self.sources)
                print(f"replay: {self.failed} of {self.ok + self.failed} scrapes of {urls} failed "
                      f"(last: {self.last_error})", file=sys.stderr)


OWNED = "LLM_REPLAY_SCRAPER"   # set for a runner whose parent runs the scraper


def start(run_dir: str | Path) -> subprocess.Popen | None:
    """The scraper process of a run (None: nothing to scrape); close its stdin to end it."""
    if os.environ.get(OWNED) or not sources(_config(run_dir)):
        return None
    return subprocess.Popen([sys.executable, "-m", "llm_replay.replay.scrape", str(run_dir)],
                            stdin=subprocess.PIPE, preexec_fn=_lower_priority)


def _config(run_dir: str | Path) -> plan.RunConfig:
    return plan.RunConfig.from_json(json.loads((Path(run_dir) / "run.json").read_text())["config"])


def _lower_priority() -> None:
    """Niced, and deaf to the terminal's Ctrl-C (it shares `replay run`'s process group): it
    ends when its stdin closes, after a last sample."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with suppress(OSError):
        os.nice(NICE)


def main(argv: list[str] | None = None) -> int:
    run_dir = Path((argv or sys.argv[1:])[0])
    config = _config(run_dir)
    stop = threading.Event()
    # the runner closes our stdin when it is done (or dies): the only stop signal we need
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), stop.set()), daemon=True).start()
    t0 = None   # on CLOCK_MONOTONIC (perf_counter), once the runner has written it
    while t0 is None and not stop.wait(0.02):
        with suppress(OSError, ValueError):
            t0 = json.loads((run_dir / "run.json").read_text()).get("t0_monotonic")
    if t0 is None:
        return 0
    Scraper(sources(config), run_dir, float(t0), config.scrape_interval_s).run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
