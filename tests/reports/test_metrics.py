"""Per-request metrics, pooled ICL/ITL, windows and goodput against hand-computed records."""
from __future__ import annotations

import math

import numpy as np
import pytest

from llm_replay.reports.analysis import analyze, good_requests
from llm_replay.reports.errors import ReportError
from llm_replay.reports.metrics import pooled_gaps, request_metrics
from llm_replay.reports.slo import load_slo
from llm_replay.reports.window import inflight, parse_bound
from tests.reports.conftest import records

# Three requests by hand: a 4-token stream, a single-token answer, a timeout.
HAND = [
    dict(request_id="a", model="m1", slo_class="chat", status="ok", scheduled_s=1.0, sent_s=1.002,
         first_token_s=1.102, last_token_s=1.402, token_times=[0.1, 0.2, 0.3, 0.4],
         chunk_tokens=[1, 1, 2, 1], input_tokens=100, output_tokens=5, prompt_tokens=100,
         completion_tokens=5),
    dict(request_id="b", model="m2", slo_class="batch", status="ok", scheduled_s=2.0, sent_s=2.0,
         first_token_s=2.5, last_token_s=2.5, token_times=[0.5], input_tokens=3000, output_tokens=1),
    dict(request_id="c", model="m1", slo_class="chat", status="timeout", scheduled_s=3.0, sent_s=3.05,
         input_tokens=10, output_tokens=8, error="read timeout"),
]


def test_per_request_metrics_by_hand():
    rm = request_metrics(records(HAND))
    c = rm.columns
    assert c["ttft_ms"][:2] == pytest.approx([100.0, 500.0])
    assert c["e2e_ms"][:2] == pytest.approx([400.0, 500.0])
    assert c["tpot_ms"][0] == pytest.approx(300.0 / 4)          # (last - first) / (5 - 1), usage count
    assert math.isnan(c["tpot_ms"][1])                           # a single token has no TPOT
    assert c["ntpot_ms"][:2] == pytest.approx([80.0, 500.0])     # E2E / n_out (b: 1 chunk, no usage)
    assert c["ttft_sched_ms"][0] == pytest.approx(102.0)         # includes 2 ms of client lag
    assert c["e2e_sched_ms"][0] == pytest.approx(402.0)
    assert c["lag_ms"] == pytest.approx([2.0, 0.0, 50.0])
    assert all(math.isnan(c[k][2]) for k in ("ttft_ms", "tpot_ms", "e2e_ms", "ntpot_ms"))  # the failure
    assert rm.n_out[:2].tolist() == [5, 1] and math.isnan(rm.n_out[2])   # usage, else chunk count
    assert rm.n_out_from_usage.tolist() == [True, False, False]


def test_no_tpot_from_one_chunk_of_several_tokens():
    """Issue 22 item 6: two tokens in one streamed event (an invisible </think> counted by the
    usage) showed no time between tokens: TPOT is undefined, not 0."""
    one = dict(request_id="d", model="m1", slo_class="chat", status="ok", scheduled_s=1.0, sent_s=1.0,
               first_token_s=1.2, last_token_s=1.2, token_times=[0.2], input_tokens=10, output_tokens=2,
               prompt_tokens=10, completion_tokens=2)
    rm = request_metrics(records([one, HAND[0]]))
    assert math.isnan(rm.columns["tpot_ms"][0]) and rm.columns["tpot_ms"][1] == pytest.approx(75.0)


def test_pooled_icl_and_per_token_itl():
    t = records(HAND)
    pooled = pooled_gaps(t.slice(0, 2))
    # gaps 100,100,100 ms within a; none within b; never across requests
    assert pooled["icl_ms"] == pytest.approx([100, 100, 100], abs=1e-3)
    # ITL per token: chunk tokens [1,1,2,1] -> gaps end chunks of 1, 2, 1 tokens -> 100, 50, 50, 100
    assert sorted(pooled["itl_ms"]) == pytest.approx([50, 50, 100, 100], abs=1e-3)


def test_pooled_gaps_skip_rows_without_matching_chunk_tokens():
    rows = [dict(HAND[0], chunk_tokens=[1, 1]), HAND[1]]      # length mismatch: no ITL for a
    pooled = pooled_gaps(records(rows))
    assert len(pooled["icl_ms"]) == 3 and len(pooled["itl_ms"]) == 0


def test_throughput_goodput_and_attainment_by_hand():
    an = analyze(records(HAND))
    # D = max(end) - min(sent) = 3.05 (timeout, end = sent) - 1.002
    assert an.duration_s == pytest.approx(3.05 - 1.002)
    sc = an.scalars()
    assert sc["issued"] == 3 and sc["ok"] == 2 and sc["failed"] == 1
    assert sc["requests_per_s"] == pytest.approx(2 / an.duration_s)
    assert sc["output_tokens_per_s"] == pytest.approx(6 / an.duration_s)      # 5 + 1
    assert sc["total_tokens_per_s"] == pytest.approx((6 + 3100) / an.duration_s)
    assert sc["error_rate"] == pytest.approx(1 / 3)
    assert sc["attainment"] == pytest.approx(2 / 3)    # no thresholds: every success is good


def test_per_request_slo_with_model_and_class_overrides():
    rm = request_metrics(records(HAND))
    spec = load_slo({"per_request": {"ttft_ms": 200, "tpot_ms": 50}})
    assert good_requests(rm, spec).tolist() == [False, False, False]   # a: TPOT 75 > 50; b: TTFT 500
    spec = load_slo({"per_request": {"ttft_ms": 200, "tpot_ms": 100},
                     "classes": {"m2": {"per_request": {"ttft_ms": 600}}}})
    assert good_requests(rm, spec).tolist() == [True, True, False]
    # slo_class overrides beat model overrides
    spec = load_slo({"per_request": {"ttft_ms": 200},
                     "classes": {"m2": {"per_request": {"ttft_ms": 600}},
                                 "batch": {"per_request": {"ttft_ms": 300}}}})
    assert good_requests(rm, spec).tolist() == [True, False, False]
    an = analyze(records(HAND), slo=load_slo({"per_request": {"e2e_s": 1}}))
    assert an.scalars()["attainment"] == pytest.approx(2 / 3)
    assert an.scalars()["token_goodput_per_s"] == pytest.approx(6 / an.duration_s)


def test_warmup_cooldown_by_time_and_count():
    t = records(HAND)
    assert analyze(t, warmup="0.5s").mask.tolist() == [False, True, True]
    assert analyze(t, warmup=1.5).mask.tolist() == [False, False, True]
    assert analyze(t, warmup="1", cooldown="1").mask.tolist() == [False, True, False]
    assert analyze(t, cooldown=2).mask.tolist() == [True, False, False]
    with pytest.raises(ReportError, match="warmup"):
        parse_bound("ten seconds", "warmup")


def test_empty_window_reports_nothing_and_does_not_crash():
    an = analyze(records(HAND), warmup="100s")
    assert not an.mask.any() and an.duration_s is None
    sc = an.scalars()
    assert sc["issued"] == 0 and sc["attainment"] is None and sc["requests_per_s"] is None
    assert len(an.values("ttft_ms")) == 0 and len(an.values("icl_ms")) == 0


def test_inflight_time_weighted_by_hand():
    start = np.array([0.0, 0.5, 1.0])
    end = np.array([2.0, 1.0, 1.5])
    # [0,1): request 0 all second, request 1 half -> 1.5; [1,2): request 0 all, request 2 half -> 1.5
    assert inflight(start, end, np.array([0.0, 1.0, 2.0])) == pytest.approx([1.5, 1.5])
    assert inflight(start, end, np.array([0.0, 0.5, 1.0])) == pytest.approx([1.0, 2.0])


def test_steady_state_window_drops_ramp():
    # 20 overlapping requests in [10, 20) after a sparse ramp of 5 short ones in [0, 5)
    ramp = [dict(request_id=f"r{i}", status="ok", scheduled_s=float(i), sent_s=float(i),
                 first_token_s=i + 0.1, last_token_s=i + 0.2, token_times=[0.1, 0.2]) for i in range(5)]
    busy = [dict(request_id=f"b{i}", status="ok", scheduled_s=10 + i * 0.5, sent_s=10 + i * 0.5,
                 first_token_s=10 + i * 0.5 + 0.1, last_token_s=10 + i * 0.5 + 5.0,
                 token_times=[0.1, 5.0]) for i in range(20)]
    an = analyze(records(ramp + busy), steady_state=0.5)
    assert an.mask[:5].sum() == 0 and an.mask[5:].sum() >= 15
    assert an.window["steady_state"]["start_s"] >= 10


def test_scraped_gauges_hold_between_scrapes_and_counters_add_up():
    import json as _json

    import pyarrow as _pa

    from llm_replay.reports.breakdown import server_series
    from llm_replay.reports.schema import SERVER_METRICS_SCHEMA
    times = [0.2, 1.2, 2.2, 3.2]
    rows = [(t, "vllm:kv_cache_usage_perc", _json.dumps({"model_name": m}), v * k)
            for t, v in zip(times, [0.1, 0.2, 0.3, 0.4]) for m, k in (("a", 1), ("b", 3))]
    rows += [(t, "vllm:num_preemptions_total", "{}", c) for t, c in zip(times, [0, 2, 2, 5])]
    table = _pa.Table.from_pylist([dict(zip(SERVER_METRICS_SCHEMA.names, r)) for r in rows], SERVER_METRICS_SCHEMA)
    out = server_series(table, np.arange(0, 4.01, 0.5))  # windows shorter than the scrape interval
    assert out["kv_cache_usage"] == pytest.approx([0.2, 0.2, 0.4, 0.4, 0.6, 0.6, 0.8, 0.8])  # mean over models
    assert out["preemptions"] == [0, 0, 2, 0, 0, 0, 3, 0]
