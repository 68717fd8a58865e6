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


def stalled_run(tmp_path, stall=(2.0, 2.3), n=600, rate=100.0):
    """A run whose client did not run during `stall` (seconds from T0): sends due then went out
    when it ran again, and every token that arrived then was stamped at the stall's end. Returns
    the run directory and the truth's (the same run with a client that always ran)."""
    truth = synth_records(n, rate=rate, lag_ms=0.1, seed=5, fail_share=0.0)
    a, b = stall
    sched, sent = truth.column("scheduled_s").to_numpy(), truth.column("sent_s").to_numpy()
    late = (sched >= a) & (sched < b)
    sent2 = np.where(late, b + (sent - sched), sent)       # the server saw them later: same service
    shift = sent2 - sent

    def read(abs_t):                                        # a read during the stall happens at its end
        return np.where((abs_t >= a) & (abs_t < b), b, abs_t)
    first = read(truth.column("first_token_s").to_numpy() + shift)
    last = read(truth.column("last_token_s").to_numpy() + shift)
    tt = truth.column("token_times")
    offs, vals = tt.combine_chunks().offsets.to_numpy(), tt.combine_chunks().values.to_numpy().astype(np.float64)
    owner = np.repeat(np.arange(n), np.diff(offs))
    vals = (read(vals + sent2[owner]) - sent2[owner]).astype(np.float32)
    t = truth
    for col, v in (("sent_s", sent2), ("first_token_s", first), ("last_token_s", last)):
        t = t.set_column(t.schema.get_field_index(col), col, pa.array(v, pa.float64()))
    t = t.set_column(t.schema.get_field_index("token_times"), "token_times",
                     pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), pa.array(vals)))
    dirs = []
    for name, table in (("run", t), ("truth", truth)):
        d = tmp_path / name
        d.mkdir(parents=True)
        pq.write_table(table, d / "records.parquet")
        dirs.append(d)
    return dirs


METRICS = ["ttft_ms", "e2e_ms", "tpot_ms", "itl_ms", "ttft_sched_ms", "e2e_sched_ms", "ntpot_ms"]


@pytest.mark.parametrize("stat", ["p50", "p90", "p99", "max", "mean"])
def test_the_bias_bound_holds_the_truth(tmp_path, stat):
    run, truth = stalled_run(tmp_path)
    objectives = [f"{m}.{stat} <= 1e9" for m in METRICS]
    got = evaluate_slo(run, {"objectives": objectives})
    true = evaluate_slo(truth, {"objectives": objectives})
    assert all(r.bound is None for r in true.rows)          # the truth kept its schedule
    moved = 0
    for r, t in zip(got.rows, true.rows):
        assert r.bound is not None, r
        lo, hi = r.bound
        assert lo - 1e-6 <= t.measured <= hi + 1e-6, (r.objective, r.bound, t.measured, r.measured)
        assert lo - 1e-6 <= r.measured <= hi + 1e-6
        moved += abs(r.measured - t.measured) > 1e-3
    assert moved >= 2                                      # the stall did move figures
    assert "bias bound" in got.table()


def test_gate_is_decisive_when_the_bound_clears_the_limit(tmp_path):
    run, _ = stalled_run(tmp_path)
    probe = evaluate_slo(run, {"objectives": ["ttft_sched_ms.max <= 1e9"]}).rows[0]
    lo, hi = probe.bound
    assert hi - lo > 50                                    # ~300 ms of stall in the sched latencies
    slo = {"objectives": ["ttft_ms.p50 <= 100000", "ttft_sched_ms.p99 <= 100000", "error_rate <= 0.01",
                          "requests_per_s >= 1"]}
    res = evaluate_slo(run, slo)                           # a healthy deployment: 1000x headroom
    assert [r.verdict for r in res.rows] == ["pass"] * 4 and res.exit_code == 0, res.table()
    res = evaluate_slo(run, {"objectives": ["ttft_ms.p50 <= 1", "error_rate <= 0.01"]})   # hopeless: fails
    assert [r.verdict for r in res.rows] == ["fail", "pass"] and res.exit_code == 1
    mid = f"ttft_sched_ms.max <= {(lo + hi) / 2:.3f}"
    res = evaluate_slo(run, {"objectives": [mid]})        # the truth may be on either side
    assert res.rows[0].verdict == "undecided" and res.exit_code == 2
    assert "straddles" in res.rows[0].note and "fell behind its schedule" in " ".join(res.notes)
    for kw in ({"judge_as_measured": True}, {"allow_bottleneck": True}):   # the old name still works
        res = evaluate_slo(run, {"objectives": [mid]}, **kw)
        assert res.rows[0].verdict == "fail" and res.rows[0].bound is None


def test_per_request_thresholds_bound_attainment(tmp_path):
    run, truth = stalled_run(tmp_path)
    slo = {"per_request": {"ttft_ms": 120}, "objectives": ["attainment >= 0.0", "goodput_rps >= 0"]}
    got, true = evaluate_slo(run, slo), evaluate_slo(truth, slo)
    lo, hi = got.rows[0].bound
    assert lo <= true.rows[0].measured <= hi and lo < hi
    assert got.exit_code == 0


def test_gate_cli_flags(tmp_path):
    run, _ = stalled_run(tmp_path)
    slo = tmp_path / "slo.yaml"
    probe = evaluate_slo(run, {"objectives": ["ttft_sched_ms.max <= 1e9"]}).rows[0]
    slo.write_text(f"objectives: ['ttft_sched_ms.max <= {sum(probe.bound) / 2:.3f}']\n")
    from tests.conftest import run_cli
    g = run_cli("replay", "gate", run, "--slo", slo)
    assert g.returncode == 2 and "bias bound" in g.stdout and "straddles" in g.stdout, g.stdout
    for flag in ("--judge-as-measured", "--allow-client-bottleneck"):
        assert run_cli("replay", "gate", run, "--slo", slo, flag).returncode == 1


# The bottleneck map's words (reports/servertime.py): requests 0.1 s apart, PER to a 5 s window,
# each window's requests with exactly its (net, queue, prefill) ms and input tokens; every request
# has its server span. Summaries use --window-s 5.
PER, OTHER_MS, OUT, TPOT_MS = 50, 2.0, 16, 20.0
QUIET = (10, 5, 40, 300)


def spans_run(tmp_path, windows, lag_ms=None, steal_at=()):
    """A run directory with records.parquet and spans.parquet (and cpu.parquet with steal at the
    times in `steal_at`) from per-window (net, queue, prefill, input tokens)."""
    from llm_replay.reports.schema import SPANS_SCHEMA
    from tests.reports.conftest import records
    w = np.repeat(np.array(windows, float), PER, axis=0)
    n = len(w)
    net, queue, prefill, inp = w.T
    sched = 0.05 + 0.1 * np.arange(n)
    sent = sched + (np.zeros(n) if lag_ms is None else lag_ms) / 1e3
    ttft = (net + queue + prefill + OTHER_MS) / 1e3
    times = ttft[:, None] + np.arange(OUT)[None, :] * TPOT_MS / 1e3
    tid = [f"{k:032x}" for k in range(n)]
    rec = records([{"request_id": f"r{k}", "model": "m", "status": "ok", "scheduled_s": sched[k], "sent_s": sent[k],
                    "first_token_s": sent[k] + ttft[k], "last_token_s": sent[k] + times[k, -1],
                    "end_s": sent[k] + times[k, -1], "token_times": times[k].tolist(), "input_tokens": int(inp[k]),
                    "prompt_tokens": int(inp[k]), "output_tokens": OUT, "completion_tokens": OUT, "trace_id": tid[k]}
                   for k in range(n)])
    d = tmp_path / "run"
    d.mkdir(parents=True)
    pq.write_table(rec, d / "records.parquet")
    sp = {"trace_id": tid, "name": ["llm_request"] * n, "received_s": sent + 2.0,
          "server_request_id": [f"cmpl-{k}" for k in range(n)], "queue_s": queue / 1e3, "prefill_s": prefill / 1e3,
          "ttft_s": ttft - net / 1e3, "decode_s": np.full(n, (OUT - 1) * TPOT_MS / 1e3)}
    sp["e2e_s"] = sp["ttft_s"] + sp["decode_s"]
    pq.write_table(pa.table({f.name: pa.array(sp[f.name], f.type) if f.name in sp else pa.nulls(n, f.type)
                             for f in SPANS_SCHEMA}), d / "spans.parquet")
    if len(steal_at):
        t = np.arange(0.05, sched.max() + 1, 0.1)
        steal = np.zeros(len(t))
        for x in steal_at:
            steal[np.abs(t - x) < 0.1] = 0.6
        cpu = {"time_s": t, "client_cores": 0.2, "client_max_cores": 0.2, "busy_cores": 0.4, "steal_cores": steal,
               "cpu_wait_share": 0.02}
        pq.write_table(pa.table({k: pa.array(np.broadcast_to(v, len(t)), pa.float32()) if k != "time_s" else v
                                 for k, v in cpu.items()}).replace_schema_metadata({"ncpu": "2", "period_s": "0.1"}),
                       d / "cpu.parquet")
    return d


def server_time(d):
    return summarize_run(d, window_s=5.0, write=False)["server_time"]


def test_a_segments_evidence_is_its_own_value_not_its_peak_windows(tmp_path):
    windows = [QUIET, QUIET, (10, 900, 40, 300), (10, 150, 40, 300), QUIET, QUIET]
    st = server_time(spans_run(tmp_path, windows))
    seg = next(s for s in st["segments"] if s["key"] == "sched")
    assert [w["key"] for w in st["map"]][2:4] == ["sched", "sched"] and seg["requests"] == 2 * PER
    peak = st["map"][2]["evidence"]["queue_share"]
    own = (900 + 150) / sum(w[0] + w[1] + w[2] + OTHER_MS for w in windows[2:4])   # the segment's requests
    assert f"{peak:.0%}" != f"{own:.0%}"
    assert seg["evidence"].startswith(f"queue {own:.0%} of TTFT"), seg["evidence"]
    assert seg["values"]["queue_share"] == pytest.approx(own)


@pytest.mark.parametrize("long_input", [300, 8000])
def test_prefill_bound_names_long_prompts_only_when_they_are_long(tmp_path, long_input):
    windows = [QUIET] * 4 + [(10, 5, 600, long_input), QUIET]
    st = server_time(spans_run(tmp_path, windows))
    seg = next(s for s in st["segments"] if s["key"] == "prefill")
    share = 600 / (10 + 5 + 600 + OTHER_MS)
    assert f"prefill {share:.0%} of TTFT" in seg["evidence"] and f"input p50 {long_input} tokens" in seg["evidence"]
    if long_input == 300:          # every prompt 300 tokens: prefill dominates, but no prompt is long
        assert seg["label"] == "prefill-bound" and "long" not in st["sentence"], st["sentence"]
    else:
        assert seg["label"] == "prefill-bound under long prompts" and "run p50 300" in seg["evidence"]


def test_one_late_send_is_not_a_client_bottleneck(tmp_path):
    busy = (100, 20, 160, 300)               # client+network 35% of TTFT
    windows = [(40, 20, 160, 300)] * 5 + [busy]     # client+network 18% of TTFT
    lag = np.zeros(len(windows) * PER)
    one = [PER * k + 20 for k in (1, 2, 3, 4)]        # one send 30 ms late in each of windows 1-4
    many = list(range(PER * 5, PER * 5 + 10))         # 10 of window 5's sends
    lag[one + many] = 30.0
    sched = 0.05 + 0.1 * np.arange(len(lag))
    st = server_time(spans_run(tmp_path, windows, lag, steal_at=sched[one + many]))
    keys = [w["key"] for w in st["map"]]
    assert keys[:5] == ["healthy"] * 5, [(w["key"], w["evidence"]["net_share"]) for w in st["map"]]
    assert keys[5] == "client" and st["map"][5]["label"] == "client/host"
    seg = st["segments"][-1]
    assert seg["evidence"] == f"client+network {100 / 282:.0%} of TTFT, 10 of {PER} sends > 10 ms late"


def test_client_only_state_does_not_say_kept_up():
    from llm_replay.reports.summary import run_state
    ts = {"t_s": [0, 10, 20, 30, 40, 50], "t0_s": 0.0, "offered_rps": [10] * 6, "achieved_rps": [10] * 6,
          "inflight": [5] * 6, "server": {}, "ttft_ms_p50": [150, 150, 5000, 40000, 135000, 135000]}
    s = run_state(ts, None)
    assert "kept up" not in s["sentence"] and s["verdict"] == "latency_grew", s
    assert "TTFT p50 grew from 150 ms to 135 s" in s["sentence"] and "--scrape" in s["sentence"]
    s = run_state(dict(ts, ttft_ms_p50=[150] * 6), None)
    assert "kept up" not in s["sentence"] and s["verdict"] == "not_observed"


def test_report_html_leads_with_the_headline(tmp_path):
    from html.parser import HTMLParser
    d, _ = late_run(tmp_path, {"steal_cores": 0.6})
    s = summarize_run(d)
    full = s["dispatch_lag"]["warning"]
    assert full.startswith("the host stalled") and len(full) > 400

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.items, self.ids, self.href = [], {}, None      # (tag, id, href, text) in page order

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            self.items.append([tag, a.get("id"), a.get("href"), ""])

        def handle_data(self, data):
            if self.items:
                self.items[-1][3] += data
    page = Page()
    page.feed((d / "report.html").read_text())
    texts = [i[3] for i in page.items]
    headline = next(k for k, i in enumerate(page.items) if i[0] == "h2" and i[3].strip() == "Headline")
    at = next(k for k, t in enumerate(texts) if full in " ".join(t.split()))
    assert headline < at and page.items[at][1]
    short = next(k for k, t in enumerate(texts) if t.startswith("the host stalled") and k != at)
    assert headline < short < at and len(texts[short]) < 250
    link = page.items[short + 1]
    assert link[0] == "a" and link[2] == f"#{page.items[at][1]}"
