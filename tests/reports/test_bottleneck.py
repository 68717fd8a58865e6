"""Who was the bottleneck when the replay fell behind: hand-made records and CPU samples, the
warning, the tainted figures and the gate's refusal to judge them."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llm_replay.reports import evaluate_slo, summarize_run
from tests.reports.synth import synth_records


def late_run(tmp_path, cpu: dict | None, late_at=(2.0, 2.5), lag_s=0.05, n=400, rate=100.0):
    """n requests at `rate` req/s; those scheduled in `late_at` were sent lag_s late."""
    t = synth_records(n, rate=rate, lag_ms=0.1, seed=3)
    sched = t.column("scheduled_s").to_numpy()
    sent = t.column("sent_s").to_numpy().copy()
    late = (sched >= late_at[0]) & (sched < late_at[1])
    sent[late] += lag_s
    shift = np.where(late, lag_s, 0.0)
    for col in ("sent_s", "first_token_s", "last_token_s"):
        t = t.set_column(t.schema.get_field_index(col), col,
                         pa.array(t.column(col).to_numpy(zero_copy_only=False) + shift, pa.float64()))
    d = tmp_path / "run"
    d.mkdir(parents=True)
    pq.write_table(t, d / "records.parquet")
    if cpu is not None:
        times = np.arange(0.05, sched.max() + 1, 0.1)
        cols = {"time_s": times}
        quiet = {"client_cores": 0.2, "client_max_cores": 0.2, "busy_cores": 0.4, "steal_cores": 0.0,
                 "cpu_wait_share": 0.02}
        for k, base in quiet.items():
            v = np.full(len(times), base)
            if k in cpu:
                v[(times > late_at[0]) & (times < late_at[1] + lag_s)] = cpu[k]
            cols[k] = pa.array(v, pa.float32())
        tab = pa.table(cols).replace_schema_metadata({"ncpu": "2", "period_s": "0.1"})
        pq.write_table(tab, d / "cpu.parquet")
    return d, late.mean()


@pytest.mark.parametrize("cpu,cause", [({"client_max_cores": 0.97, "client_cores": 0.97}, "client"),
                                       ({"steal_cores": 0.6}, "host"),
                                       ({"cpu_wait_share": 0.9, "busy_cores": 1.95}, "host"),
                                       ({"client_max_cores": 0.95, "steal_cores": 0.4}, "client+host"),
                                       ({}, "unexplained"), (None, None)])
def test_cause_of_late_sends(tmp_path, cpu, cause):
    d, share = late_run(tmp_path, cpu)
    lag = summarize_run(d, write=False)["dispatch_lag"]
    assert lag["behind_schedule"] and lag["late_share"] == pytest.approx(share, abs=0.01)
    assert lag["cause"] == cause
    assert lag["offered_rps"] == pytest.approx(100, rel=0.15) and lag["achieved_rps"] == pytest.approx(100, rel=0.15)
    if cpu:
        w = lag["windows"]
        assert len(w) == 1 and 1.8 <= w[0]["start_s"] <= 2.1 and 2.4 <= w[0]["end_s"] <= 2.7
    assert "ttft_sched_ms" in lag["tainted"] and ("ttft_ms" in lag["tainted"]) == (cause is not None and "host" in cause)
    head = {"client": "the client was the bottleneck", "host": "the host stalled, not the client",
            "client+host": "both the client and the host", "unexplained": "neither the client nor the host",
            None: "no CPU samples"}[cause]
    assert head in lag["warning"]


def test_on_schedule_no_warning(tmp_path):
    d, _ = late_run(tmp_path, {"steal_cores": 0.6}, lag_s=0.002)      # 2 ms late: on schedule
    s = summarize_run(d, write=False)
    assert not s["dispatch_lag"]["behind_schedule"] and s["dispatch_lag"]["warning"] is None
    assert not s["dispatch_lag"]["tainted"] and s["dispatch_lag"]["cpu"]["samples"] > 0


def test_gate_refuses_tainted_objectives_unless_allowed(tmp_path):
    d, _ = late_run(tmp_path, {"steal_cores": 0.6})
    slo = {"objectives": ["ttft_ms.p50 <= 100000", "ttft_sched_ms.p50 <= 100000", "error_rate <= 1"]}
    res = evaluate_slo(d, slo)
    verdicts = [r.verdict for r in res.rows]
    assert verdicts == ["cannot evaluate", "cannot evaluate", "pass"] and res.exit_code == 2
    assert "fell behind its schedule (host)" in res.rows[0].note
    res = evaluate_slo(d, slo, allow_bottleneck=True)
    assert [r.verdict for r in res.rows] == ["pass"] * 3 and res.exit_code == 0
    # the client alone behind: latencies from sent are still good (kernel receive stamps)
    d2, _ = late_run(tmp_path / "c", {"client_max_cores": 0.97})
    assert [r.verdict for r in evaluate_slo(d2, slo).rows] == ["pass", "cannot evaluate", "pass"]
