"""Server spans joined to records (reports/servertime.py): counts, decomposition, bottleneck map,
gates and compare, on run directories whose answer is known by construction."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llm_replay.reports import compare_runs, evaluate_slo
from llm_replay.reports.schema import RECORD_SCHEMA, SERVER_METRICS_SCHEMA, SPANS_SCHEMA
from tests.reports.synth import write_run

N, PER_WIN, W = 300, 50, 5.0      # 0.1 s apart: window k of 5 s holds requests 50k..50k+49
# per window: (net, queue, prefill, tpot) ms, input tokens; server metrics: kv usage, waiting, running
HEALTHY = (10, 5, 40, 20, 500)
WINDOWS = [HEALTHY, (10, 5, 40, 60, 500), (10, 800, 40, 20, 500), (10, 40, 600, 20, 8000),
           (10, 800, 40, 20, 500), (500, 5, 40, 20, 500)]
METRICS = [(0.3, 0, 8), (0.5, 0, 64), (1.0, 30, 64), (0.4, 0, 8), (0.5, 30, 16), (0.3, 0, 8)]
OTHER_MS, OUT = 2.0, 16
MISSING_OK, FAILED, UNTRACED, DUPLICATE, LATE = 10, 20, 30, 60, 100


def build(tmp_path, name, windows=WINDOWS, spans=True, seed=0):
    rng = np.random.default_rng(seed)
    i = np.arange(N)
    w = np.array([windows[k] for k in i // PER_WIN], float)
    net, queue, prefill, tpot = w[:, 0], w[:, 1] + rng.uniform(0, 2, N), w[:, 2] + rng.uniform(0, 4, N), w[:, 3]
    sent = 0.05 + 0.1 * i
    ttft = (net + queue + prefill + OTHER_MS) / 1e3
    times = ttft[:, None] + np.arange(OUT)[None, :] * tpot[:, None] / 1e3
    failed = i == FAILED
    tid = [f"{k:032x}" for k in i]
    tid[UNTRACED] = None
    rec = pa.table({
        "request_id": [f"r{k}" for k in i], "model": ["m"] * N, "status": np.where(failed, "http_error", "ok"),
        "scheduled_s": sent, "sent_s": sent,
        "first_token_s": pa.array(np.where(failed, np.nan, sent + ttft), from_pandas=True),
        "last_token_s": pa.array(np.where(failed, np.nan, sent + times[:, -1]), from_pandas=True),
        "end_s": sent + times[:, -1], "token_times": pa.array([None if f else list(t) for f, t in zip(failed, times)],
                                                              pa.list_(pa.float32())),
        "input_tokens": w[:, 4].astype(np.int32), "prompt_tokens": w[:, 4].astype(np.int32),
        "output_tokens": np.full(N, OUT, np.int32), "completion_tokens": np.full(N, OUT, np.int32),
        "trace_id": pa.array(tid, pa.string())})
    rec = pa.table([rec.column(f.name).cast(f.type) if f.name in rec.column_names else pa.nulls(N, f.type)
                    for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)
    t = np.arange(0.5, 31, 1.0)
    k = np.clip(((t - 0.05) // W).astype(int), 0, len(METRICS) - 1)
    srv = pa.table({"time_s": np.repeat(t, 3),
                    "name": ["vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_requests_running"] * len(t),
                    "labels": ["{}"] * 3 * len(t), "value": np.array([METRICS[x] for x in k], float).ravel()},
                   schema=SERVER_METRICS_SCHEMA)
    run = write_run(tmp_path / name, rec, {"t0_wall": 1.7e9, "otlp": {"wait_s": 2.0}}, srv)
    if spans:
        keep = (i != MISSING_OK) & (i != FAILED) & (i != UNTRACED)
        deadline = float(rec.column("end_s").to_numpy().max()) + 2.0
        received = np.where(i == LATE, deadline + 5, sent + 2.0)
        cols = {"trace_id": [tid[k] for k in i[keep]], "name": "llm_request", "received_s": received[keep],
                "server_request_id": [f"cmpl-{k}" for k in i[keep]], "queue_s": queue[keep] / 1e3,
                "prefill_s": prefill[keep] / 1e3, "ttft_s": (queue + prefill + OTHER_MS)[keep] / 1e3,
                "decode_s": ((OUT - 1) * tpot)[keep] / 1e3}
        cols["e2e_s"] = cols["ttft_s"] + cols["decode_s"]
        rows = pa.Table.from_pydict({k: pa.array(v if not isinstance(v, str) else [v] * int(keep.sum()))
                                     for k, v in cols.items()}).to_pylist()
        dup = dict(next(r for r in rows if r["trace_id"] == tid[DUPLICATE]), received_s=40.0, queue_s=99.0)
        stray = dict(rows[0], trace_id="f" * 32, server_request_id="stray")
        spans_t = pa.Table.from_pylist([dup] + rows + [stray])     # the duplicate comes first in the file
        pq.write_table(pa.table({f.name: spans_t.column(f.name).cast(f.type) if f.name in spans_t.column_names
                                 else pa.nulls(spans_t.num_rows, f.type) for f in SPANS_SCHEMA}), run / "spans.parquet")
    return run


def test_join_counts_decomposition_and_map(tmp_path):
    run = build(tmp_path, "run")
    out = subprocess.run(["replay", "report", str(run), "--window-s", "5", "--force"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    s = json.loads((run / "summary.json").read_text())
    st = s["server_time"]
    c = st["counts"]
    assert (c["traced"], c["joined"], c["missing_ok"], c["missing_failed"]) == (N - 1, N - 3, 1, 1)
    assert (c["duplicate"], c["unmatched"], c["late"], c["spans"]) == (1, 1, 1, N - 3 + 2)
    # the first received duplicate (queue ~5 ms), not the one first in the file (99 s)
    assert st["overall"]["queue_ms"]["p90"] < 1000 and st["overall"]["queue_ms"]["n"] == N - 3
    assert abs(st["overall"]["net_ms"]["p50"] - 10) < 1e-6 and 40 <= st["overall"]["queue_ms"]["p50"] <= 42
    keys = [w["key"] for w in st["map"]]
    assert keys == ["healthy", "decode", "kv", "prefill", "sched", "net"], keys
    assert st["map"][1]["label"] == "decode-bound at batch 64"
    kv = st["map"][2]["evidence"]
    assert kv["kv_cache_usage"] == 1.0 and kv["waiting"] == 30 and kv["queue_share"] > 0.9
    assert st["map"][3]["evidence"]["input_tokens_p50"] == 8000
    missing = next(r for r in st["slowest"] + [{"request_id": "r10"}] if r["request_id"] == "r10")
    assert "queue_ms" not in missing or missing["queue_ms"] is None          # never guessed
    top = st["slowest"][0]
    assert top["ttft_ms"] > 800 and top["joined"] and top["server_request_id"].startswith("cmpl-")
    assert abs(top["net_ms"] + top["queue_ms"] + top["prefill_ms"] + top["other_ms"] - top["ttft_ms"]) < 1e-6
    assert "queueing behind a full KV cache (KV 100%, 30 waiting" in st["sentence"]
    assert "where the time went" in out.stdout and "queueing behind a full KV cache" in out.stdout
    assert any("1 missing ok" in w for w in s["warnings"])
    html = (run / "report.html").read_text()
    assert "Where the time went" in html and 'aria-label="Bottleneck map"' in html and "cmpl-" in html


def test_gate_on_server_components(tmp_path):
    run = build(tmp_path, "run")
    # the run's queueing phase is a level shift: judge every request, not the steady window after it
    res = evaluate_slo(run, {"objectives": ["queue_ms.p99 <= 200", "queue_ms.p50 <= 200", "queue_share.p50 <= 0.5"]},
                       whole_run=True)
    assert [r.verdict for r in res.rows] == ["fail", "pass", "pass"]
    assert res.rows[0].measured > 800 and res.rows[0].n == N - 3
    bare = build(tmp_path, "bare", spans=False)
    (tmp_path / "slo.yaml").write_text("objectives: ['queue_ms.p99 <= 200']\n")
    out = subprocess.run(["replay", "gate", str(bare), "--slo", str(tmp_path / "slo.yaml")], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "no server spans (run with --otlp)" in out.stdout and not out.stderr


def test_compare_names_the_grown_component(tmp_path):
    base = build(tmp_path, "base", windows=[HEALTHY] * 6, seed=1)
    cand = build(tmp_path, "cand", windows=[HEALTHY] * 3 + [(10, 400, 40, 20, 500)] * 3, seed=2)
    out = subprocess.run(["replay", "compare", str(base), str(cand), "--json"], capture_output=True, text=True)
    res = json.loads(out.stdout)
    rows = {r["metric"]: r for r in res["rows"]}
    assert rows["queue_ms.p99"]["verdict"] == "regressed" and rows["ttft_ms.p99"]["verdict"] == "regressed"
    assert rows["net_ms.p50"]["verdict"] == "no significant change" and "queue_ms.mean" not in rows
    assert any(n.startswith("ttft_ms.") and "queue grew most" in n for n in res["notes"]), res["notes"]
    same = compare_runs(base, build(tmp_path, "again", windows=[HEALTHY] * 6, seed=3))
    assert not same.notes and {r.verdict for r in same.rows if r.metric.startswith("queue_ms")} <= \
        {"no significant change"}


def test_forged_spans_are_never_joined(tmp_path):
    """Another process posted spans with the run's trace ids before the server's (queue 99 s):
    impossible beside the client's own TTFT, they are counted and ignored whatever their order;
    a record with two different possible spans, or only forged ones, joins none."""
    run = build(tmp_path, "run", windows=[HEALTHY] * 6)
    real = pq.read_table(run / "spans.parquet")
    rows = [r for r in real.to_pylist() if r["trace_id"] != f"{200:032x}"]
    forged = [dict(r, queue_s=99.0, ttft_s=99.5, e2e_s=100.0, received_s=0.0, span_id="f" * 16)
              for r in real.to_pylist() if r["server_request_id"] != "stray"]
    other = dict(next(r for r in rows if r["trace_id"] == f"{201:032x}"), received_s=0.0, span_id="e" * 16)
    other["queue_s"] /= 2
    pq.write_table(pa.Table.from_pylist(forged + [other] + rows, schema=real.schema), run / "spans.parquet")
    out = subprocess.run(["replay", "report", str(run), "--window-s", "5", "--force"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    s = json.loads((run / "summary.json").read_text())
    st, c = s["server_time"], s["server_time"]["counts"]
    # real spans: N - 3 (missing, failed, untraced), one more (r200) removed; the queue-99 s duplicate too
    assert c["impossible"] == len(forged) + 1 and c["rejected"] == 2, c
    assert c["joined"] == N - 3 - 2 and c["missing_ok"] == 1
    assert st["overall"]["queue_ms"]["p99"] < 20 and st["overall"]["net_ms"]["p50"] > 0
    assert "impossible server spans ignored" in st["sentence"] and st["ttft_tail"]["queue_ms"] < 20
    assert any("2 rejected" in w and "impossible" in w for w in s["warnings"]), s["warnings"]
    res = evaluate_slo(run, {"objectives": ["queue_ms.p90 <= 200", "queue_share.p95 <= 0.5"]})
    assert [r.verdict for r in res.rows] == ["pass", "pass"]
