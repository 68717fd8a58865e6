"""`replay demo` and `replay sweep` end to end against a real engine-stub subprocess."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli
from tests.replay.runkit import write_trace

pytest.importorskip("torch")


def test_demo_closes_the_loop(tmp_path):
    run_dir = tmp_path / "demo"
    p = run_cli("replay", "demo", "--duration", "8", "--rate", "2", "-o", run_dir, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert "trace models" not in p.stderr  # every trace model is mapped to its own engine model
    trace = pq.read_table(tmp_path / "demo-trace.parquet")
    records = pq.read_table(run_dir / "records.parquet")
    assert records.num_rows == trace.num_rows > 0  # one record per trace row
    assert set(records.column("model").to_pylist()) == set(trace.column("model").to_pylist())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["goodput"]["per_request_slo"] and summary["gate"]["rows"]
    assert (run_dir / "server_metrics.parquet").exists()  # the engine's /metrics were scraped
    assert (run_dir / "report.html").stat().st_size > 10_000
    assert "headline:" in p.stdout and str(run_dir / "report.html") in p.stdout
    # the demo leaves the client a core of its own: on a quiet host its replay keeps the schedule
    lag = summary["dispatch_lag"]
    if lag["behind_schedule"] and lag["cause"] != "client":
        pytest.skip(f"the host was busy during the demo (cause {lag['cause']}; cpu {lag['cpu']}): "
                    f"its schedule could not be judged")
    assert not lag["behind_schedule"] and not any("bottleneck" in w for w in summary["warnings"]), lag["warning"]


def test_sweep_brackets_capacity(tmp_path):
    # One sequence at a time: queueing makes TTFT explode once the rate passes the service rate,
    # so a low rate passes and a high one fails whatever the machine's speed.
    trace = write_trace(tmp_path / "t.parquet", 12, gap_s=1.0, input_tokens=200, output_tokens=120)
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives:\n  - ttft_ms.p90 <= 1500\n  - error_rate <= 0.01\n")
    out = tmp_path / "sweep"
    p = run_cli("replay", "sweep", "--trace", trace, "--slo", slo, "--rates", "1,64", "--max-runs", "4",
                "--tolerance", "0.5", "-o", out, "--engine-arg=--max-num-seqs", "--engine-arg=1", "--", "--no-progress", timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((out / "sweep.json").read_text())
    pts = {pt["rate"]: pt for pt in result["points"]}
    assert pts[1.0]["passed"] and not pts[64.0]["passed"]
    assert 1.0 <= result["capacity_rps"] < 64.0
    assert len(pts) <= 4
    assert result["knee_rps"] is None or 1.0 <= result["knee_rps"] <= 64.0
    for pt in pts.values():  # every point is a full run: one record per row
        assert pq.read_table(f"{pt['run_dir']}/records.parquet").num_rows == 12
    assert "capacity (highest rate meeting the SLO)" in p.stdout and result["capacity_bracketed"]
    assert "<svg" in (out / "capacity.html").read_text()
