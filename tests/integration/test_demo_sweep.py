"""`replay sweep` end to end against a real engine-stub subprocess (`replay demo` runs exactly as the
README's quick start says in tests/test_readme.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli
from tests.replay.runkit import write_trace

pytest.importorskip("torch")


@pytest.mark.timing
def test_sweep_brackets_capacity(tmp_path):
    # One sequence at a time: queueing makes TTFT explode once the rate passes the service rate,
    # so a low rate passes and a high one fails whatever the machine's speed.
    trace = write_trace(tmp_path / "t.parquet", 12, gap_s=1.0, input_tokens=200, output_tokens=120)
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives:\n  - ttft_ms.p50 <= 1500\n  - error_rate <= 0.25\n")   # what 12 requests can prove at 95 %
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
    for pt in pts.values():  # every point runs until decided: one record per row of its passes of the trace
        info = json.loads((Path(pt["run_dir"]) / "run.json").read_text())
        assert info["status"] in ("decided", "completed") and info["until_decided"]["rows"] >= 12
        assert pq.read_table(f"{pt['run_dir']}/records.parquet").num_rows == info["until_decided"]["rows"]
    assert "capacity (highest rate meeting the SLO)" in p.stdout and result["capacity_bracketed"]
    assert "<svg" in (out / "capacity.html").read_text()
