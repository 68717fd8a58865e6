"""summary.json `connections`: requests on new vs kept-alive connections, connect times, and the
warning that suggests --preconnect (hand-made records)."""
from __future__ import annotations

import numpy as np
from llm_replay.reports import format_summary, summarize_run
from llm_replay.reports.breakdown import QUEUEING_NOTE, peak_per_second, weighted_quantiles
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
    tt = cn["ttft_ms"]         # compared within the same seconds: the 50 new ones sent within 0.5 s of a reused one
    assert tt["new_matched"]["n"] == tt["new_matched_excess"]["n"] == 50 and cn["unmatched_new"] == 100
    assert abs(tt["new_matched_excess"]["p50"] - 150.0) < 1.0 and cn["note"] is None
    assert f"{tt['new_matched']['p99']:.1f} ms against {tt['reused_matched']['p99']:.1f} ms" in w
    text = format_summary(s)
    assert "connections opened / reused (connect p99 ms)" in text and "150 / 300" in text
    assert f"--preconnect {peak}" in (run / "summary.md").read_text()


def test_no_warning_when_new_connections_cost_little(make_run):
    # 2x slower but only 5 ms more, then 15 ms more but not 2x: neither warns
    for ttft_new, ttft_reused in ((0.010, 0.005), (0.045, 0.030)):
        s = summarize_run(make_run(f"ok{ttft_new}", records(_rows(50, 100, ttft_new, ttft_reused))), write=False)
        assert s["connections"]["opened"] == 50 and s["connections"]["warning"] is None
        assert not any("--preconnect" in w for w in s["warnings"])


def _timeline(seed: int, *, ttft_new, queue=lambda t: 0.0, burst=(60.0, 61.0), n_burst=300, n_burst_reused=10,
              n_quiet_new=20, rate=40.0, duration=120.0) -> list[dict]:
    """A 2-minute run at `rate` req/s on kept-alive connections, with a burst of `n_burst` requests in
    `burst` in which all but `n_burst_reused` (spread through it) open a connection (connect ~1 ms),
    and `n_quiet_new` reconnects at quiet times. TTFT: 40 ms (log-normal) + `queue(sent)` for every
    request, + `ttft_new` for those on a new connection; 8 tokens 20 ms apart."""
    rng = np.random.default_rng(seed)
    quiet = np.sort(rng.uniform(0.0, duration, int(rate * duration)))
    quiet = quiet[(quiet < burst[0]) | (quiet >= burst[1])]
    in_burst = np.sort(rng.uniform(*burst, n_burst))
    new = np.r_[np.zeros(len(quiet), bool), np.ones(n_burst, bool)]
    new[rng.choice(len(quiet), n_quiet_new, replace=False)] = True
    new[len(quiet) + rng.choice(n_burst, n_burst_reused, replace=False)] = False
    sched = np.r_[quiet, in_burst]
    rows = []
    for i in np.argsort(sched, kind="stable"):
        connect = float(rng.lognormal(np.log(0.001), 0.3)) if new[i] else None
        sent = sched[i] + 2e-4 + (connect or 0.0)
        ttft = 0.040 * rng.lognormal(0.0, 0.3) + queue(sent) + (ttft_new if new[i] else 0.0)
        times = [ttft + 0.020 * k for k in range(8)]
        rows.append({"request_id": f"r{len(rows)}", "model": "m", "scheduled_s": sched[i], "sent_s": sent,
                     "connect_s": connect, "first_token_s": sent + ttft, "last_token_s": sent + times[-1],
                     "token_times": times, "input_tokens": 500, "output_tokens": 8, "completion_tokens": 8,
                     "status": "ok", "http_status": 200})
    return rows


def _queueing(t: float) -> float:
    """The server's queue: 1.5 s at the burst's start growing to 3 s at its end, drained 0.3 s later."""
    if 60.0 <= t < 61.0:
        return 1.5 + 1.5 * (t - 60.0)
    return 3.0 * max(0.0, 1.0 - (t - 61.0) / 0.3) if t >= 61.0 else 0.0


def test_server_queueing_in_a_burst_of_new_connections_does_not_suggest_preconnect(make_run):
    """The burst opens 290 connections and the server queues everything sent in it, new and
    reused alike: over the whole run new connections look 40x slower, but the reused requests sent
    in the same seconds were just as slow. No warning; the section says why."""
    run = make_run("queueing", records(_timeline(1, ttft_new=0.0, queue=_queueing)))
    s = summarize_run(run)
    cn, tt = s["connections"], s["connections"]["ttft_ms"]
    assert cn["opened"] == 310 and cn["reused"] > 4000
    assert tt["new"]["p99"] > 2000 and tt["reused"]["p99"] < 200     # what the whole-run rule warned on
    assert not any("--preconnect" in w for w in s["warnings"])
    assert "--preconnect" not in (run / "summary.md").read_text()
    assert cn["warning"] is None and cn["note"] == QUEUEING_NOTE
    assert tt["new_matched"]["n"] == tt["new_matched_excess"]["n"] == 310 and cn["unmatched_new"] == 0
    assert tt["reused_matched"]["p99"] > 2000                          # their window peers queued too
    assert abs(tt["new_matched_excess"]["p99"]) < 0.5 * tt["new_matched"]["p99"]


def test_slow_new_connections_beside_fast_reused_ones_still_warn(make_run):
    """Same run shape, no queueing: requests on new connections wait 250 ms more for their first
    token than the reused requests sent in the same seconds. That is connection set-up: warn."""
    run = make_run("setup", records(_timeline(2, ttft_new=0.250)))
    s = summarize_run(run)
    cn, tt = s["connections"], s["connections"]["ttft_ms"]
    assert cn["opened"] == 310 and tt["new_matched"]["n"] == 310
    assert tt["reused_matched"]["p99"] < 150 and tt["new_matched"]["p50"] > 250
    assert 200 < tt["new_matched_excess"]["p50"] < 300 and tt["new_matched_excess"]["p99"] > 200
    w = cn["warning"]
    assert w and w in s["warnings"] and cn["note"] is None
    assert f"--preconnect {cn['peak_opened_per_s']}" in w and 280 <= cn["peak_opened_per_s"] <= 300
    assert "sent in the same seconds (310 of them had such peers)" in w


def test_new_connections_without_reused_peers_are_not_blamed(make_run):
    """The first second opens every connection (nothing to reuse yet) and is slow; reused requests
    come only 2 s later. Nothing in the same seconds to compare with: no warning."""
    rows = _rows(100, 0, ttft_new=0.500, ttft_reused=0.0)[:-1]
    rows += [{**r, "request_id": f"k{i}", "scheduled_s": r["scheduled_s"] + 3.0, "sent_s": r["sent_s"] + 3.0,
              "first_token_s": r["first_token_s"] + 3.0, "last_token_s": r["last_token_s"] + 3.0}
             for i, r in enumerate(_rows(0, 300, ttft_new=0.0, ttft_reused=0.050)[:-1])]
    s = summarize_run(make_run("cold_start", records(rows)), write=False)
    cn, tt = s["connections"], s["connections"]["ttft_ms"]
    assert (cn["opened"], cn["reused"]) == (100, 300) and tt["new"]["p99"] > 5 * tt["reused"]["p99"]
    assert cn["warning"] is None and cn["note"] is None
    assert cn["unmatched_new"] == 100 and tt["new_matched"]["n"] == 0 and tt["reused_matched"]["n"] == 0
    assert tt["new_matched_excess"] == {"n": 0, "p50": None, "p99": None}


def test_weighted_quantiles():
    x = np.array([3.0, 1.0, 2.0, 10.0])
    assert np.allclose(weighted_quantiles(x, np.full(4, 0.3), (0, 20, 50, 99, 100)),
                       np.percentile(x, [0, 20, 50, 99, 100], method="hazen"))
    assert weighted_quantiles(np.array([]), np.array([]), (50,)) == [None]
    assert weighted_quantiles(np.array([7.0]), np.array([0.2]), (1, 99)) == [7.0, 7.0]
    # 1 holds the first quarter of the weight (middle 0.125), 5 the rest (middle 0.625)
    assert weighted_quantiles(np.array([5.0, 1.0]), np.array([3.0, 1.0]), (10, 50, 75)) == [1.0, 4.0, 5.0]


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
