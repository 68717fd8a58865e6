"""replay's locustfile under Locust's own CLI (headless): same records as `replay run`."""
from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import run_cli
from tests.replay.runkit import assert_well_formed, records, run_info, sse_server, write_trace

LOCUSTFILE = str(Path(__file__).resolve().parents[2] / "replay" / "locustfile.py")


def test_locust_cli_headless_run(tmp_path):
    n = 120
    trace = write_trace(tmp_path / "t.parquet", n, gap_s=0.005, output_tokens=5)
    with sse_server("--interval", "0.001") as url:
        proc = run_cli("locust", "-f", LOCUSTFILE, "--headless", "-u", "1", "-r", "1", "--host", url,
                       "--trace", trace, "--run-dir", tmp_path / "run", "--no-check", "--no-progress",
                       "--model-map", "*=m", "--run-time", "60s", timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = records(tmp_path / "run")
    assert len(df) == n and (df.status == "ok").all()
    assert_well_formed(df)
    assert run_info(tmp_path / "run")["status_counts"] == {"ok": n}
    final = (proc.stdout + proc.stderr).split("Shutting down")[-1]
    # one Locust request event per request and type (E2E, TTFT), never one per token
    assert re.search(rf"E2E\s+all\s+{n}\s", final) and re.search(rf"TTFT\s+all\s+{n}\s", final), final
