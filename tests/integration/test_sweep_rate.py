"""`replay sweep --max-requests N`: each point is labelled with the rate its replayed rows
arrived at, and a capacity no failing rate bounds from above is reported as a lower bound."""
from __future__ import annotations

import pytest

import json

import numpy as np
import pyarrow as pa

from tests.conftest import run_cli
from tests.replay.runkit import records, sse_server
from llm_replay.traces.trace import Trace


@pytest.mark.slow
def test_rate_is_the_replayed_rows_rate_and_unbracketed_capacity_is_a_lower_bound(tmp_path):
    # 10 dense rows (20 req/s) then 30 sparse ones (1 req/s): the whole trace's mean rate is
    # ~1.3 req/s, far below that of the 10 rows a `--max-requests 10` run replays.
    arrivals = np.concatenate([np.arange(10) * 0.05, 0.45 + np.arange(1, 31) * 1.0])
    n = len(arrivals)
    trace = tmp_path / "t.parquet"
    Trace(pa.table({"arrival_ns": pa.array((arrivals * 1e9).astype("int64")),
                    "input_tokens": pa.array(np.full(n, 20), pa.int32()),
                    "output_tokens": pa.array(np.full(n, 4), pa.int32())})).write(trace)
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives:\n  - error_rate <= 0.3\n")   # 0 of 10 failed proves <= 0.26 at 95 %
    out = tmp_path / "sweep"
    with sse_server() as url:
        p = run_cli("replay", "sweep", "--trace", trace, "--target", url, "--slo", slo, "--rates", "4,8",
                    "--max-requests", "10", "-o", out, "--", "--no-progress", "--no-check", timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    result = json.loads((out / "sweep.json").read_text())
    for pt in result["points"]:
        sched = records(pt["run_dir"]).scheduled_s.to_numpy()
        assert len(sched) == 10
        replayed = (len(sched) - 1) / (sched.max() - sched.min())
        assert abs(replayed / pt["rate"] - 1) < 0.01, (pt["rate"], replayed)
        assert pt["goodput_rps"] <= pt["rate"] * 1.2  # goodput cannot much exceed the offered rate
    # every rate passed: 8 req/s is a lower bound on the capacity, not the capacity
    assert result["capacity_rps"] == 8.0 and result["capacity_bracketed"] is False
    assert "capacity: at least 8 req/s" in p.stdout
    assert "highest rate meeting the SLO" not in p.stdout
    assert "at least 8 req/s" in (out / "capacity.html").read_text()
