"""summarize_run / `replay report`: summary.json schema, Markdown, breakdowns, server metrics,
dispatch-lag and length-mismatch warnings."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from llm_replay.reports import SERVER_METRICS_SCHEMA, ReportError, format_summary, summarize_run
from tests.conftest import run_cli
from tests.reports.synth import synth_records

TOP_KEYS = {"schema_version", "records_schema_version", "generated_at", "run", "window", "counts",
            "n_out_source", "throughput", "latency", "goodput", "errors", "dispatch_lag",
            "length_mismatch", "breakdowns", "timeseries", "warnings"}


def _server_metrics(t_end: float) -> pa.Table:
    t = np.arange(0.0, t_end, 0.5)
    rows = {"time_s": [], "name": [], "labels": [], "value": []}
    for name, vals, labels in (("vllm:kv_cache_usage_perc", 0.5 + 0 * t, '{"model_name":"m"}'),
                               ("vllm:num_requests_running", 4 + 0 * t, '{"model_name":"m"}'),
                               ("vllm:num_requests_waiting", 2 + 0 * t, '{"model_name":"m"}'),
                               ("vllm:num_preemptions_total", np.floor(t), '{"model_name":"m"}')):
        rows["time_s"] += t.tolist()
        rows["name"] += [name] * len(t)
        rows["labels"] += [labels] * len(t)
        rows["value"] += list(vals)
    return pa.Table.from_pydict(rows, schema=SERVER_METRICS_SCHEMA)


def test_report_cli_writes_all_outputs(make_run):
    table = synth_records(2000, seed=4, chunk_tokens=True)
    run = make_run("run", table, config={"target": "http://127.0.0.1:1", "workers": 2,
                                         "client": {"cpu_percent": 41.5}},
                   server=_server_metrics(45.0))
    slo = run / "slo.yaml"
    slo.write_text("per_request: {ttft_ms: 300}\nobjectives: ['ttft_ms.p99 <= 2000']\n")
    r = run_cli("replay", "report", run, "--slo", slo, "--warmup", "5s", "--window-s", "5")
    assert r.returncode == 0, r.stderr
    assert "ttft_ms" in r.stdout and "wrote" in r.stdout and "SLO gate (exit 0)" in r.stdout
    s = json.loads((run / "summary.json").read_text())
    assert TOP_KEYS <= set(s) and s["schema_version"] == 1
    assert s["run"]["config"]["workers"] == 2
    assert s["window"]["warmup"] == {"by": "time", "value": 5.0, "cut_s": pytest.approx(
        pc.min(table.column("scheduled_s")).as_py() + 5)}
    sched = table.column("scheduled_s").to_numpy()
    assert s["counts"]["measured"] == int((sched >= sched.min() + 5).sum())
    ts = s["timeseries"]
    assert ts["window_s"] == 5 and ts["server"]["kv_cache_usage"][0] == pytest.approx(0.5)
    full = len(ts["t_s"]) - 1                 # the last window is partial
    assert round(sum(ts["offered_rps"][:full]) * 5) == int((sched < ts["t0_s"] + 5 * full).sum())
    assert min(ts["inflight"][1:-1]) > 0
    assert ts["server"]["running"][1] == 4 and ts["server"]["preemptions"][2] == pytest.approx(5.0)
    assert len(s["latency"]["itl_ms"]) and s["latency"]["itl_ms"]["n"] > s["latency"]["icl_ms"]["n"]
    assert s["gate"]["exit_code"] == 0 and s["goodput"]["per_request_slo"] is True
    md = (run / "summary.md").read_text()
    assert "| ttft_ms |" in md and "SLO gate" in md
    html = (run / "report.html").read_text()
    assert len(html) > 10_000 and "client cpu_percent" in html and "41.5" in html
    assert s["dispatch_lag"]["client"] == {"cpu_percent": 41.5}


def test_breakdowns_match_subsets(make_run):
    table = synth_records(1500, seed=9)
    run = make_run("run", table)
    s = summarize_run(run, write=False)
    models = table.column("model").to_numpy(zero_copy_only=False)
    ok = (table.column("status").to_numpy(zero_copy_only=False) == "ok")
    ttft = (table.column("first_token_s").to_numpy() - table.column("sent_s").to_numpy()) * 1e3
    for row in s["breakdowns"]["model"]:
        sel = (models == row["key"])
        assert row["issued"] == sel.sum() and row["ok"] == (sel & ok).sum()
        assert row["ttft_ms"]["p99"] == pytest.approx(np.percentile(ttft[sel & ok], 99))
    assert sum(r["issued"] for r in s["breakdowns"]["input_length"]) == 1500
    assert {r["key"] for r in s["breakdowns"]["slo_class"]} == {"interactive", "batch"}
    assert s["errors"]["failed"] == (~ok).sum() and sum(s["errors"]["by_status"].values()) == (~ok).sum()
    assert s["errors"]["by_http_status"].get("500", 0) == s["errors"]["by_status"].get("http_error", 0)
    text = format_summary(s)
    assert "Per model" in text and "Errors" in text


def test_client_bottleneck_and_length_mismatch_are_flagged(make_run):
    table = synth_records(1000, seed=5, lag_ms=40.0)          # a client falling behind its schedule
    out = table.column("output_tokens").to_numpy().copy()
    comp = table.column("completion_tokens")
    comp = pa.array(np.where(np.arange(1000) % 10 == 0, out + 3, out), mask=comp.is_null().to_numpy(zero_copy_only=False))
    table = table.set_column(table.schema.get_field_index("completion_tokens"), "completion_tokens", comp)
    s = summarize_run(make_run("run", table), write=False)
    lag = s["dispatch_lag"]
    assert lag["behind_schedule"] is True and lag["late_share"] > 0.5 and lag["p99"] > 100
    # no CPU samples with these records: the cause is unknown, and the warning says so
    assert lag["cause"] is None and lag["client_bottleneck"] is True and "ttft_sched_ms" in lag["tainted"]
    assert any("fell behind its schedule (no CPU samples" in w for w in s["warnings"])
    mm = s["length_mismatch"]["output"]
    assert mm["mismatched"] == pytest.approx(s["counts"]["ok"] / 10, rel=0.2) and mm["mean_diff"] == 3
    ok = table.column("status").to_numpy(zero_copy_only=False) == "ok"
    assert mm["examples"] == [f"r{i}" for i in np.flatnonzero(ok & (np.arange(1000) % 10 == 0))[:5]]
    assert any("output length" in w for w in s["warnings"])
    assert s["length_mismatch"]["input"]["mismatched"] == 0


def test_all_failed_and_empty_window_still_summarise(make_run):
    s = summarize_run(make_run("dead", synth_records(40, seed=1, fail_share=1.0)))
    assert s["counts"]["ok"] == 0 and s["latency"]["ttft_ms"]["n"] == 0
    assert "every measured request failed" in " ".join(s["warnings"])
    s = summarize_run(make_run("late", synth_records(40, seed=1)), warmup="1000s", write=False)
    assert s["counts"]["measured"] == 0 and "no requests in the measured window" in s["warnings"]
    json.dumps(s, allow_nan=False)


def test_streamed_time_columns_give_the_same_summary_from_parquet_and_arrow(make_run, tmp_path):
    """summarize_run streams the time columns batch by batch (metrics.BATCH rows): a run over
    several batches and file chunks gives what request_metrics on the whole table gives."""
    import pyarrow.parquet as pq
    from llm_replay.reports.analysis import analyze
    from llm_replay.reports.metrics import BATCH
    from llm_replay.reports.stats import describe
    table = synth_records(BATCH + 3000, seed=4)
    run = make_run("run", table)
    pq.write_table(table, run / "records.parquet", row_group_size=70_000)   # batches and row groups misaligned
    s = summarize_run(run, write=False)
    an = analyze(table)
    for k in ("ttft_ms", "e2e_sched_ms", "tpot_ms", "icl_ms"):
        want = describe(an.column(k))
        assert [s["latency"][k][q] for q in ("n", "mean", "p50", "p99", "max")] == \
            [want[q] for q in ("n", "mean", "p50", "p99", "max")]
    with pa.OSFile(str(tmp_path / "records.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    a = summarize_run(tmp_path / "records.arrow", write=False)
    assert a["latency"] == s["latency"] and a["breakdowns"] == s["breakdowns"]
    bad = table.set_column(table.schema.get_field_index("sent_s"), "sent_s",
                           pa.array(["x"] * table.num_rows))
    pq.write_table(bad, run / "records.parquet")
    with pytest.raises(ReportError, match="field 'sent_s': has type string"):
        summarize_run(run, write=False)


def test_length_buckets_count_the_edges_below_each_length():
    from llm_replay.reports.breakdown import LENGTH_EDGES, length_buckets
    x = np.array([0, 1, 127, 128, 129, 131071, 131072, 10**7, -5, np.nan, 4096, 4095.5])
    for edges in (LENGTH_EDGES, (10, 100, 1000)):
        codes, labels = length_buckets(x, edges)
        want = np.searchsorted(np.asarray(edges, float), x, side="right") - 1
        want[np.isnan(x) | (want < 0)] = len(edges)
        assert codes.tolist() == want.tolist() and labels[-1] == "(unknown)" and len(labels) == len(edges) + 1


def _gauges(t_end: float, kv, waiting, preempt) -> pa.Table:
    t = np.arange(0.0, t_end, 0.5)
    rows = {"time_s": [], "name": [], "labels": [], "value": []}
    for name, f in (("vllm:kv_cache_usage_perc", kv), ("vllm:num_requests_waiting", waiting),
                    ("vllm:num_preemptions_total", preempt)):
        rows["time_s"] += t.tolist()
        rows["name"] += [name] * len(t)
        rows["labels"] += ['{"model_name":"m"}'] * len(t)
        rows["value"] += [float(f(x)) for x in t]
    return pa.Table.from_pydict(rows, schema=SERVER_METRICS_SCHEMA)


def test_the_summary_says_the_runs_state_in_words(make_run):
    table = synth_records(1500, seed=5)
    end = float(np.nanmax(table.column("last_token_s").to_numpy(zero_copy_only=False)))
    sat = make_run("sat", table, config={"target": "http://127.0.0.1:1", "t0_wall": 1_764_684_000.0},
                   server=_gauges(end + 1, lambda x: min(1.0, 0.3 + x / 10), lambda x: max(0, x - 12) * 2,
                                  lambda x: max(0, x - 15)))
    s = summarize_run(sat, write=False)["state"]
    assert s["verdict"] == "saturated" and 5 <= s["from_s"] <= 7 and s["queue_max"] > 10 and s["preemptions"] > 0
    assert s["sentence"].startswith("saturated from 14:0") and "UTC: KV cache at 100%" in s["sentence"]
    ok = make_run("ok", table, config={"target": "http://127.0.0.1:1"},
                  server=_gauges(end + 1, lambda x: 0.3, lambda x: 0, lambda x: 0))
    s = summarize_run(ok, write=False)
    assert s["state"]["verdict"] == "healthy" and "KV cache peak 30%" in s["state"]["sentence"]
    from llm_replay.reports.text import format_summary
    assert "healthy: no request waited" in format_summary(s).replace("\n", " ").replace("  ", " ")


def test_without_server_metrics_the_state_is_judged_from_the_client_side():
    from llm_replay.reports.summary import run_state
    ts = {"t_s": [0, 10, 20, 30, 40, 50], "t0_s": 0.0, "offered_rps": [10] * 6, "server": {},
          "achieved_rps": [10, 9, 7, 6, 5, 5], "inflight": [5, 8, 20, 40, 60, 80]}
    s = run_state(ts, None)
    assert s["verdict"] == "falling_behind" and "grew from 6 to 70" in s["sentence"]
    s = run_state(dict(ts, achieved_rps=[10] * 6, inflight=[5] * 6), None)
    assert s["verdict"] == "not_observed" and "kept up" not in s["sentence"]
