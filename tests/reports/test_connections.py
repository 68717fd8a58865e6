"""summary.json `connections`: requests on new vs kept-alive connections, connect times, and the
warning that suggests --preconnect (hand-made records)."""
from __future__ import annotations

import numpy as np
from llm_replay.reports import format_summary, summarize_run
from llm_replay.reports.connections import peak_per_second
from tests.reports.conftest import records


def _rows(n_new: int, n_reused: int, ttft_new: float, ttft_reused: float) -> list[dict]:
    """`n_new` requests 10 ms apart that each opened a connection (connect 1..20 ms), then
    `n_reused` on kept-alive connections; one token at sent + TTFT."""
    rows = []
    for i in range(n_new + n_reused):
        new = i < n_new
        sent = i * 0.01
        first = sent + (ttft_new if new else ttft_reused) + (i % 7) * 1e-4
        rows.append({"request_id": f"r{i}", "model": "m", "scheduled_s": sent - 1e-4, "sent_s": sent,
                     "connect_s": 0.001 + 0.019 * (i % 10) / 9 if new else None,
                     "first_token_s": first, "last_token_s": first, "token_times": [first - sent],
                     "input_tokens": 10, "output_tokens": 1, "completion_tokens": 1, "status": "ok",
                     "http_status": 200})
    rows.append({"request_id": "refused", "model": "m", "scheduled_s": 5.0, "status": "connection_error",
                 "error": "Connection refused"})           # never got a connection: neither
    return rows


def test_new_connections_with_a_slow_ttft_tail_warn_and_suggest_preconnect(make_run):
    run = make_run("slow", records(_rows(150, 300, ttft_new=0.200, ttft_reused=0.050)))
    s = summarize_run(run)
    cn = s["connections"]
    assert cn["recorded"] is True and (cn["opened"], cn["reused"]) == (150, 300)
    assert cn["connect_ms"]["n"] == 150 and abs(cn["connect_ms"]["max"] - 20.0) < 1e-3
    assert abs(cn["connect_ms"]["p50"] - 1e3 * np.median([0.001 + 0.019 * (i % 10) / 9 for i in range(150)])) < 1e-3
    assert abs(cn["ttft_ms"]["new"]["p50"] - 200.3) < 0.5 and abs(cn["ttft_ms"]["reused"]["p99"] - 50.6) < 0.5
    assert cn["ttft_ms"]["new"]["n"] == 150 and cn["ttft_ms"]["reused"]["n"] == 300
    peak = cn["peak_opened_per_s"]
    assert 99 <= peak <= 101                       # 10 ms apart: about 100 within any one second
    w = cn["warning"]
    assert w and w in s["warnings"]
    assert w.startswith("150 requests paid a connection set-up") and f"--preconnect {peak}" in w
    assert f"{cn['ttft_ms']['new']['p99']:.1f} ms against {cn['ttft_ms']['reused']['p99']:.1f} ms" in w
    text = format_summary(s)
    assert "connections opened / reused (connect p99 ms)" in text and "150 / 300" in text
    assert f"--preconnect {peak}" in (run / "summary.md").read_text()


def test_no_warning_when_new_connections_cost_little(make_run):
    # 2x slower but only 5 ms more, then 15 ms more but not 2x: neither warns
    for ttft_new, ttft_reused in ((0.010, 0.005), (0.045, 0.030)):
        s = summarize_run(make_run(f"ok{ttft_new}", records(_rows(50, 100, ttft_new, ttft_reused))), write=False)
        assert s["connections"]["opened"] == 50 and s["connections"]["warning"] is None
        assert not any("--preconnect" in w for w in s["warnings"])


def test_runs_without_connect_times(make_run):
    """Older records (no connect_s column) still load: the section says it was not recorded.
    A run made with this version whose requests all reused connections is recorded (run.json)."""
    table = records(_rows(0, 40, 0.1, 0.05))
    old = make_run("old", table.drop_columns(["connect_s"]))
    s = summarize_run(old, write=False)
    cn = s["connections"]
    assert cn["recorded"] is False and cn["opened"] is None and cn["warning"] is None
    assert "connections opened / reused (connect p99 ms)" in format_summary(s)
    s = summarize_run(make_run("all_reused", table, config={"config": {"preconnect": 40}}), write=False)
    cn = s["connections"]
    assert cn["recorded"] is True and (cn["opened"], cn["reused"]) == (0, 40)
    assert cn["connect_ms"]["n"] == 0 and cn["connect_ms"]["p99"] is None and cn["warning"] is None
    assert "0 / 40 (-)" in format_summary(s)


def test_peak_per_second():
    assert peak_per_second(np.array([])) == 0
    assert peak_per_second(np.array([0.0, 0.5, 0.99, 1.0, 1.2, np.nan, 5.0])) == 4   # [0.5, 1.5): 0.5..1.2
    assert peak_per_second(np.arange(1000) / 128) == 128    # exact binary times: [t, t + 1) holds 128
