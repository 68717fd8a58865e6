"""The stimulus certificate (reports/certificate.py): real runs against the SSE test server, one
that delivers its load and one whose trace no client process can send, and the records of the
first edited so that its sends come seconds late, a worker is lost or the client is saturated."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llm_replay.reports import evaluate_slo, summarize_run
from llm_replay.reports.certificate import LAG_P99_MS
from tests.conftest import run_cli
from tests.replay.runkit import replay_run, sse_server, write_trace

EASY = {"objectives": ["error_rate <= 0.5", "ttft_ms.p50 <= 100000"]}   # a healthy server passes it


@pytest.fixture(scope="module")
def delivered_run(tmp_path_factory):
    """150 rows at 100 req/s against a zero-work server: a load one client process sends with ease."""
    tmp = tmp_path_factory.mktemp("cert")
    trace = write_trace(tmp / "t.parquet", 150, gap_s=0.01, output_tokens=4)
    with sse_server("--interval", "0") as url:
        replay_run(trace, url, tmp / "run", "--model-map", "*=m", timeout=120)
    return tmp / "run"


def copy_run(src, dst, *, shift=None, config=None, cpu=None, run_json=True):
    """A copy of a run directory, its records' sends (and stamps) moved by `shift(scheduled)` s,
    run.json updated with `config` (or left out), cpu.parquet's client_max_cores set to `cpu`."""
    shutil.copytree(src, dst)
    for f in ("summary.json", "summary.md", "report.html"):
        (dst / f).unlink(missing_ok=True)
    if shift is not None:
        t = pq.read_table(dst / "records.parquet")
        d = shift(t.column("scheduled_s").to_numpy())
        for col in ("sent_s", "first_token_s", "last_token_s"):
            i = t.schema.get_field_index(col)
            t = t.set_column(i, t.schema.field(i), pa.array(t.column(col).to_numpy(zero_copy_only=False) + d,
                                                             t.schema.field(i).type))
        pq.write_table(t, dst / "records.parquet")
    if not run_json:
        (dst / "run.json").unlink()
    elif config:
        info = json.loads((dst / "run.json").read_text())
        (dst / "run.json").write_text(json.dumps(info | config))
    if cpu is not None:
        c = pq.read_table(dst / "cpu.parquet")
        i = c.schema.get_field_index("client_max_cores")
        c = c.set_column(i, c.schema.field(i), pa.array(np.full(c.num_rows, cpu), c.schema.field(i).type))
        pq.write_table(c.replace_schema_metadata(pq.read_schema(src / "cpu.parquet").metadata), dst / "cpu.parquet")
    return dst


def test_a_delivered_load_is_certified_and_the_gate_passes(delivered_run):
    s = json.loads((delivered_run / "summary.json").read_text())["stimulus"]
    assert s["delivered"] is True and s["reasons"] == [], s
    assert s["rows"] == s["sent"] == 150 and s["not_sent"] == 0 and s["lost_workers"] == []
    assert s["offered_rps"] == pytest.approx(100, rel=0.02)
    assert [w["offered"] for w in s["windows"]] == [100, 50]
    assert sum(w["sent"] for w in s["windows"]) == 150
    assert s["cpu"] is not None and s["cpu"]["samples"] > 0
    g = evaluate_slo(delivered_run, EASY)
    assert g.exit_code == 0 and g.stimulus["delivered"] is True and "not delivered" not in g.table()


def test_sends_seconds_late_are_not_delivered(delivered_run, tmp_path):
    # from 0.5 s on the client fell behind: each send 3 s later per second of schedule
    late = copy_run(delivered_run, tmp_path / "late", shift=lambda s: np.maximum(s - 0.5, 0) * 3)
    s = summarize_run(late, write=False)["stimulus"]
    assert s["delivered"] is False and s["lag_ms"]["p99"] > LAG_P99_MS
    assert any("windows of 1 s got less than 95%" in r for r in s["reasons"]), s["reasons"]
    assert any(r.startswith("send lag p99") for r in s["reasons"])
    g = evaluate_slo(late, EASY)
    assert [r.verdict for r in g.rows] == ["pass", "pass"] and g.exit_code == 2
    table = g.table()
    assert "NOT DELIVERED (exit 2)" in table and "cannot pass: the stimulus was not delivered: " in table
    hopeless = evaluate_slo(late, {"objectives": ["requests_per_s >= 1000000"]})
    assert hopeless.exit_code == 1                       # a failure still fails
    # the same records without run.json: unknown, not refused
    bare = copy_run(late, tmp_path / "bare", run_json=False)
    g = evaluate_slo(bare, EASY)
    assert g.stimulus["delivered"] is None and g.stimulus["reasons"] and g.exit_code == 0


@pytest.mark.parametrize("edit,words", [({"config": {"lost_workers": [1]}}, "worker(s) 1 lost"),
                                        ({"cpu": 0.99}, "the client was saturated")])
def test_lost_workers_and_a_saturated_client_are_not_delivered(delivered_run, tmp_path, edit, words):
    d = copy_run(delivered_run, tmp_path / "run", **edit)
    g = evaluate_slo(d, EASY)
    assert g.exit_code == 2 and any(words in r for r in g.stimulus["reasons"]), g.stimulus["reasons"]
    assert summarize_run(d, write=False)["stimulus"]["delivered"] is False


def test_a_trace_no_client_can_send_is_not_delivered(tmp_path):
    """4,000 rows in 0.2 s (20k req/s) from one client process."""
    trace = write_trace(tmp_path / "t.parquet", 4000, gap_s=0.00005, output_tokens=1)
    out = tmp_path / "run"
    with sse_server("--interval", "0") as url:
        replay_run(trace, url, out, "--model-map", "*=m", timeout=300)
    s = json.loads((out / "summary.json").read_text())["stimulus"]
    assert s["delivered"] is False and s["offered_rps"] == pytest.approx(20000, rel=0.01)
    assert s["achieved_rps"] < 0.95 * s["offered_rps"]
    assert any(r.startswith("send lag p99") for r in s["reasons"]), s["reasons"]
    first = s["windows"][0]
    assert first["offered"] == 4000 and first["sent"] < 0.95 * 4000     # the sends spill into later windows
    assert any("windows of 1 s got less than 95%" in r for r in s["reasons"])
    slo = tmp_path / "slo.yaml"
    slo.write_text("objectives: ['error_rate <= 0.5']\n")
    g = run_cli("replay", "gate", out, "--slo", slo, check=False)
    assert g.returncode == 2 and "the stimulus was not delivered" in g.stdout, g.stdout


def test_a_sparse_trace_allows_lag_by_its_gaps(tmp_path):
    """10 rows 0.4 s apart: two sends held 80 ms by a busy host are still the trace's load (each
    nearer its own slot than its neighbour's); every send 150 ms late is not."""
    trace = write_trace(tmp_path / "t.parquet", 10, gap_s=0.4, output_tokens=2)
    with sse_server("--interval", "0") as url:
        replay_run(trace, url, tmp_path / "run", "--model-map", "*=m", timeout=120)
    two = copy_run(tmp_path / "run", tmp_path / "two", shift=lambda s: np.where(np.argsort(np.argsort(s)) < 2, 0.08, 0))
    s = summarize_run(two, write=False)["stimulus"]
    assert s["lag_ms"]["p99"] > LAG_P99_MS and s["thresholds"]["lag_p99_ms"] == pytest.approx(100, rel=0.02)
    assert s["delivered"] is True, s["reasons"]
    assert evaluate_slo(two, EASY).exit_code == 0
    late = copy_run(tmp_path / "run", tmp_path / "late", shift=lambda s: np.full(len(s), 0.15))
    s = summarize_run(late, write=False)["stimulus"]
    assert s["delivered"] is False and any(r.startswith("send lag p99") for r in s["reasons"]), s["reasons"]
