"""Every benchmark in benchmarks/ still runs end to end: each script as its own process (this Python,
cwd the repo root) with the smallest arguments that still take its whole path (every condition,
client and phase it prints), exit 0 and its result lines printed. What the figures are is not
judged here (a busy host makes them anything); that the script gets to them is. A benchmark that
needs what this host lacks (a real traced vLLM server, tcpdump as root, torch) is skipped with the
missing thing named. The ones exercised by tests of their own (ab_calibration, fuzz_campaign,
gate_calibration, realism; cache_tenants by tests/docs/test_page_experiments.py) are not repeated here.

Each run has a quiet host's bound scaled by conftest's host slowdown; the script runs in a session of
its own, and on a timeout that whole process group is killed. Every server a benchmark starts is on
127.0.0.1 and ended by the benchmark itself."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, repo_env, wait_s

pytestmark = pytest.mark.slow


def bench(name: str, *args: str, timeout: float = 60) -> str:
    """Run benchmarks/<name>.py with args; its stdout, after asserting exit 0. `timeout` is a quiet host's."""
    cmd = [sys.executable, str(REPO / "benchmarks" / f"{name}.py"), *args]
    p = subprocess.Popen(cmd, cwd=REPO, env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=wait_s(timeout))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{name}.py {' '.join(args)} ran past {wait_s(timeout):.0f} s\n"
                    f"stdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    assert p.returncode == 0, f"{name}.py exited {p.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    return out


def test_accuracy():
    out = bench("accuracy", "--rate", "20", "--duration", "1", "--tokens", "5", "--interval", "0.005")
    for role in ("ours", "ours-read", "aiohttp"):
        assert f"{role} TTFT error" in out and f"{role} gap error" in out, out


def test_agentic():
    out = bench("agentic", "--calls", "200", "--hours", "0.005", "--steps", "5", "--delay", "0.05")
    assert "baseline: rows 200 records 200" in out and "graph: rows 200 records 200" in out, out
    assert "ratios graph/baseline:" in out and "one record per row: True" in out, out


def test_analyze():
    out = bench("analyze", "--records", "2000", "--loop-records", "500")
    assert "results agree" in out and "ratio loop / full summary:" in out, out


def test_cli_startup():
    out = bench("cli_startup", "--repeat", "1")
    assert "replay --help" in out and "x bare" in out, out
    assert "UNEXPECTED" not in out, out


def test_client_overhead():
    out = bench("client_overhead", "--rates", "20", "--duration", "1", "--tokens", "5")
    assert "ratio ours/aiohttp CPU per token" in out and "ratio replay x1/aiohttp" in out, out


def test_contention():
    out = bench("contention", "--duration", "1", "--rate", "10", "--busy", "1", "--tokens", "3",
                "--ttft", "0.01", "--interval", "0.005", timeout=120)
    assert "ratio to quiet" in out and "target (new, 1 spinners" in out, out


def test_deep_chain():
    out = bench("deep_chain", "--small", "200", "--large", "1000", "--stop-calls", "500", "--stop-rows", "500",
                "--stop-after", "2")
    assert "report of a chain: 200 calls" in out, out
    assert "Ctrl-C on a 500-call chain" in out and "Ctrl-C with 500 plain rows unsent" in out, out


def test_engine_batching():
    pytest.importorskip("torch", reason="engine_batching starts engine-stub, which needs torch")
    out = bench("engine_batching", "--seconds", "0.5", "--prompt", "4", "--max-tokens", "8")
    assert "gain at 64 streams vs 1:" in out and "paged/contiguous" in out, out


def test_generate():
    out = bench("generate", "--rows", "2000", "--baseline-rows", "500")
    assert "vectorised:" in out and "speed-up:" in out, out


def test_long_trace():
    out = bench("long_trace", "--rows", "5000", "--requests", "200", "--rate", "200")
    assert out.count("ok 200/200") == 2 and "peak RSS big/small" in out, out


def test_master_ceiling():
    out = bench("master_ceiling", "--workers", "1", "--records", "500", "--tokens", "5")
    assert "baseline (one process" in out, out
    for mode in ("live", "burst"):
        assert re.search(rf"^\s*{mode}\s+1\s+[\d,]+\s", out, re.M), out


def test_otlp_check():
    """Opt-in: it checks spans of a real vLLM server exporting OpenTelemetry to 127.0.0.1:4318 (docs/servertime.md).
    Without one (OTLP_CHECK_TARGET, OTLP_CHECK_MODEL) only its --help is run."""
    assert "--target" in bench("otlp_check", "--help")
    target, model = os.environ.get("OTLP_CHECK_TARGET"), os.environ.get("OTLP_CHECK_MODEL")
    if not (target and model):
        pytest.skip("otlp_check needs a real vLLM server that exports OpenTelemetry spans to 127.0.0.1:4318: "
                    "set OTLP_CHECK_TARGET=http://127.0.0.1:PORT and OTLP_CHECK_MODEL=<served model name>")
    assert re.match(r"https?://(127\.0\.0\.1|localhost)[:/]", target), "OTLP_CHECK_TARGET must be on 127.0.0.1"
    out = bench("otlp_check", "--target", target, "--model", model, "--rate", "2", "--duration", "3")
    assert "otlp" in out and "FAIL" not in out, out


def test_otlp_overhead():
    out = bench("otlp_overhead", "--rate", "20", "--duration", "1", "--tokens", "5", "--repeat", "1")
    assert re.search(r"(\d+)/\1 joined, 0 missing", out) and "medians of 1:" in out, out


def test_roofline():
    out = bench("roofline", "--rates", "50", "--duration", "1", "--tokens", "5")
    for client in ("replay", "aiohttp"):
        assert re.search(rf"^\s*50\s+{client}\s+[\d.]+\s", out, re.M), out


def test_stamps_pcap():
    if shutil.which("tcpdump") is None:
        pytest.skip("stamps_pcap needs tcpdump (not on PATH)")
    if os.geteuid() != 0:
        pytest.skip(f"stamps_pcap captures on lo, which needs root; running as uid {os.geteuid()}")
    out = bench("stamps_pcap", "--duration", "1", "--rate", "10", "--tokens", "5", "--busy", "1", timeout=120)
    assert "skipped:" not in out and "matched" in out and "zero gaps" in out, out


def test_trace_io():
    out = bench("trace_io", "--rows", "2000")
    assert "import speed vs pandas.read_csv:" in out, out
