"""Issue 37 item 4: warm-up and level shifts found by change points (reports/steady.py); the gate
judges the steady window by default and names it, says "no steady state" when there is none."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llm_replay import reports
from llm_replay.reports.steady import MIN_REQUESTS, steady_window
from tests.conftest import run_cli
from tests.reports.synth import synth_records

SPEC = {"objectives": ["ttft_ms.p90 <= 200"]}


def _run(tmp_path, parts) -> str:
    """Records of consecutive phases [(requests, ttft factor)], 50 req/s, as a run directory."""
    tables, t0, first = [], 0.0, 0
    for n, factor in parts:
        t = synth_records(n, seed=first + 1, rate=50.0, ttft_factor=factor, fail_share=0.0, t0=t0, first_id=first,
                          models=("m",), classes=("c",))
        tables.append(t)
        t0, first = float(np.max(t.column("scheduled_s").to_numpy())), first + n
    d = tmp_path / "run"
    d.mkdir()
    pq.write_table(pa.concat_tables(tables), d / "records.parquet")
    return str(d)


def test_a_warm_up_is_cut_and_the_gate_names_the_window(tmp_path):
    run = _run(tmp_path, [(300, 4.0), (1200, 1.0)])
    g = reports.evaluate_slo(run, SPEC)
    assert g.exit_code == 0 and 1100 <= g.rows[0].n <= 1300, g.table()
    assert any("judged the steady window from" in n for n in g.notes), g.notes
    whole = reports.evaluate_slo(run, SPEC, whole_run=True)   # the warm-up's slow requests fail the p90
    assert whole.exit_code == 1 and whole.rows[0].n == 1500
    p = run_cli("replay", "gate", run, "--slo", _spec(tmp_path), "--whole-run")
    assert p.returncode == 1, p.stdout
    s = reports.summarize_run(run, write=False)
    assert s["steady"]["steady"]["start_s"] == s["steady"]["change_points_s"][-1] and \
        4 <= s["steady"]["change_points_s"][0] <= 8   # the warm-up ends at 6 s (300 requests at 50/s)


def _spec(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(json.dumps(SPEC))
    return f


def test_a_stationary_run_is_judged_whole(tmp_path):
    g = reports.evaluate_slo(_run(tmp_path, [(1500, 1.0)]), SPEC)
    assert g.rows[0].n == 1500 and any("steady throughout" in n for n in g.notes), g.notes


def test_latency_still_moving_is_no_steady_state(tmp_path):
    run = _run(tmp_path, [(250, f) for f in (1.0, 1.6, 2.6, 4.2, 6.8, 11.0)])
    g = reports.evaluate_slo(run, {"objectives": ["ttft_ms.p50 <= 100000"]})
    assert g.rows[0].n == 1500 and any(n.startswith("no steady state") for n in g.notes), g.notes
    assert any("no steady state" in w for w in reports.summarize_run(run, write=False)["warnings"])


def test_false_cuts_are_rare_on_stationary_runs_and_warm_ups_are_found():
    """Seeded: 100 stationary lognormal runs of 1,000 requests are (almost) never cut; 100 ramps (3x
    at the start, decaying over 100 requests) are all cut, past their steepest part (request 80)."""
    rng = np.random.default_rng(7)
    n, i = 1000, np.arange(1000)
    cut_stationary = cut_ramp = 0
    for _ in range(100):
        for ramp in (False, True):
            ttft = rng.lognormal(np.log(100), 0.6, n) * (1 + 2 * np.exp(-i / 100) if ramp else 1)
            found = steady_window(i * 0.05, np.ones(n, bool), ttft, rng.lognormal(np.log(10), 0.2, n), i * 0.05,
                                  i * 0.05 + 0.2, np.ones(n, bool))
            st = found["steady"]
            if not ramp:
                cut_stationary += st is None or not st["whole_run"]
            else:
                cut_ramp += st is not None and not st["whole_run"] and st["start_s"] >= 0.05 * 80
    assert cut_stationary <= 2 and cut_ramp >= 95, (cut_stationary, cut_ramp)


def test_short_runs_are_not_segmented(tmp_path):
    g = reports.evaluate_slo(_run(tmp_path, [(MIN_REQUESTS - 1, 1.0)]), SPEC)
    assert not any("steady" in n for n in g.notes)
