"""A replay whose host does not run it: `replay run` pinned to one core beside a real-time CPU
hog that holds the core 30 ms in every 100 ms (as a hypervisor or a noisy neighbour would).
Its sends come late, yet the client itself is nearly idle: the report must blame the host
(the client waited for its core), not the client, and the gate must still judge a clear margin
(at both ends of the bias bound) and refuse only a limit inside it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import repo_env, run_cli, wait_s
from tests.replay.runkit import records, sse_server, write_trace

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not Path("/proc/pressure/cpu").exists(),
                                reason="needs Linux CPU affinity and pressure stall information (/proc/pressure/cpu)")
HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except PermissionError:
    print("no-rt", flush=True)
    sys.exit(0)
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    busy = time.perf_counter() + 0.03
    while time.perf_counter() < busy:
        pass
    time.sleep(0.07)
"""


def test_a_starved_client_is_a_host_stall_not_a_client_bottleneck(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", 300, gap_s=0.01, output_tokens=4)
    out = tmp_path / "run"
    cpu = sorted(os.sched_getaffinity(0))[0]
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpu), str(wait_s(60))], stdout=subprocess.PIPE, text=True)
    try:
        if hog.stdout.readline().strip() != "ready":
            pytest.skip("real-time scheduling is not permitted here")
        with sse_server("--interval", "0.002") as url:
            p = subprocess.run([sys.executable, "-m", "llm_replay.replay", "run", "--trace", str(trace), "--target", url,
                                "-o", str(out), "--no-check", "--no-progress", "--model-map", "*=m"],
                               capture_output=True, text=True, env=repo_env(), timeout=wait_s(120),
                               start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    finally:
        hog.kill()
        hog.wait()
    assert p.returncode == 0, p.stderr
    assert (records(out).status == "ok").all() and (out / "cpu.parquet").exists()
    import json
    lag = json.loads((out / "summary.json").read_text())["dispatch_lag"]
    assert lag["behind_schedule"], lag
    assert lag["cause"] == "host", lag
    assert lag["cpu"]["client_cores_mean"] < 0.5 and lag["late_by_cause"]["contention"] > 0
    assert "the host stalled, not the client" in p.stdout
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives: ['ttft_ms.p50 <= 100000', 'ttft_sched_ms.max <= 100000', 'error_rate <= 0.5']\n")
    # 1000x headroom: every objective holds at both ends of the bias bound, so the gate passes, unless
    # the stall kept the offered load from being delivered (certificate.py: how late the sends were
    # depends on this host), and then it cannot pass and says why
    g = run_cli("replay", "gate", out, "--slo", slo)
    text = " ".join(g.stdout.split())   # the caption wraps anywhere
    assert "fell behind its schedule" in text and "pass (95%)" in text, g.stdout
    if json.loads((out / "summary.json").read_text())["stimulus"]["delivered"]:
        assert g.returncode == 0 and "bias bound" in text, g.stdout
    else:
        assert g.returncode == 2 and "NOT DELIVERED" in text, g.stdout
    from llm_replay.reports import evaluate_slo
    lo, hi = evaluate_slo(out, {"objectives": ["ttft_sched_ms.max <= 1e9"]}).rows[0].bound
    assert hi - lo >= 10                                 # the late sends' lag is inside the bound
    slo.write_text(f"objectives: ['ttft_sched_ms.max <= {(lo + hi) / 2}']\n")
    g = run_cli("replay", "gate", out, "--slo", slo)
    assert g.returncode == 2 and "straddles" in g.stdout, g.stdout
    g = run_cli("replay", "gate", out, "--slo", slo, "--judge-as-measured")
    assert g.returncode == 1, g.stdout
