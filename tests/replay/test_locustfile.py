"""replay's locustfile under Locust's own CLI (headless): same records as `replay run`."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import run_cli
from tests.replay.runkit import assert_well_formed, records, run_info, sse_server, write_trace

LOCUSTFILE = str(Path(__file__).resolve().parents[2] / "replay" / "locustfile.py")


def test_locust_cli_headless_run_and_run_time_limit(tmp_path):
    n = 100  # 100 rows in the first 0.5 s, then 50 rows from 60 s on: --run-time 4s cuts them
    trace = write_trace(tmp_path / "t.parquet", n + 50, gap_s=0.005, output_tokens=5)
    t = pq.read_table(trace)
    late = pa.concat_arrays([t["arrival_ns"].combine_chunks()[:n],
                             pa.array(60_000_000_000 + np.arange(50, dtype=np.int64) * 1_000_000)])
    pq.write_table(t.set_column(0, "arrival_ns", late), trace)
    with sse_server("--interval", "0.001") as url:
        proc = run_cli("locust", "-f", LOCUSTFILE, "--headless", "-u", "1", "-r", "1", "--host", url,
                       "--trace", trace, "--run-dir", tmp_path / "run", "--no-check", "--no-progress",
                       "--model-map", "*=m", "--run-time", "4s", timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = records(tmp_path / "run")
    assert len(df) == n + 50 and df.request_id.is_unique
    assert_well_formed(df)
    info = run_info(tmp_path / "run")
    assert info["status_counts"] == {"ok": n, "not_sent": 50} and info["status"] == "interrupted"
    final = (proc.stdout + proc.stderr).split("Shutting down")[-1]
    # one Locust request event per request and type (E2E, TTFT), never one per token
    assert re.search(rf"E2E\s+all\s+{n}\s", final) and re.search(rf"TTFT\s+all\s+{n}\s", final), final
